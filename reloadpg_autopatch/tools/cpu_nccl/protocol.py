"""NCCL's suspend protocol on CPU, for both variants: what one communicator does.

The protocol that NCCL's source describes (``ncclCommSuspend``/``ncclCommResume``/
``ncclCommMemStats``; ``docs/suspend-facts.md``), on CPU:

- ``memory_stats()`` returns exactly ``{"suspend", "suspended", "persist", "total"}``: the
  suspendable bytes (not decremented by a suspend), 0 or 1, the resident bytes, and their sum.
- ``suspend()`` and ``resume()`` are barriers over the group's members, with no timeout, as
  NCCL's bootstrap barriers are (a real gloo barrier, issued on the backend directly, so that
  no pre-hook and no store operation sees it). A member that never calls blocks the others.
- A second ``suspend()``, or ``resume()`` while awake, raises ``DistBackendError`` (NCCL's
  ``ncclInvalidUsage``: "Already suspended" / "Not in suspended state") *before* the barrier.
- Suspend copies a real CPU buffer of the configured size to a host backup and frees it (NCCL:
  copy to pinned host memory, unmap); resume allocates it again, copies it back and checks it.
- A collective on a comm that is not awake is refused as a sticky fault (variant B, and
  accelerator tensors on variant A: the only collectives that reach Python).

The concrete classes (``gloo_subclass``, ``python_backend``) give it a gloo backend to barrier on.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .device import device_memory
from .ledger import BACKENDS, CALLS, Call
from .switches import Settings, settings_for
from .wording import (
    ALREADY_SUSPENDED,
    ILLEGAL_ADDRESS,
    NOT_SUSPENDED,
    SPLIT_SHARE,
    UNINITIALIZED_CLASSIC,
    UNINITIALIZED_NCCL2,
    first_line,
    nccl_error,
)


class SuspendProtocol:
    """The NCCL suspend protocol; the concrete classes give it a gloo backend to barrier on."""

    registered_name: str
    settings: Settings
    label: str
    _backup: bytes | None

    def _protocol_init(
        self, name: str, rank: int, size: int, defaults: dict[str, Any] | None = None
    ) -> None:
        global_rank = dist.get_rank() if dist.is_initialized() else rank
        self.registered_name = name
        self.group_rank, self.group_size, self.global_rank = rank, size, global_rank
        self.settings = settings_for(global_rank, defaults)
        self.label = f"{name}#{len(BACKENDS)}"
        self.initialized = not self.settings.uninitialized
        self.state = "awake"  # "suspended", "half-suspended" (failed suspend), "faulted"
        self.fault: str | None = None
        self.aborted = False
        self._mutex = threading.Lock()  # NCCLComm's mutex: suspend, resume, stats
        self._arrive = threading.Event()  # lets a "never arriving" call go on
        self._stats_bytes = (self.settings.suspend_bytes, self.settings.persist_bytes)
        self._persist = bytearray(self.settings.persist_bytes)
        self._buffer: bytearray | None = self._fill(bytearray(self.settings.suspend_bytes))
        self._digest = self._digest_of(self._buffer)
        self._backup = None
        self.suspends = 0
        self.resumes = 0
        self._sequence = 0

    # -- what a test reads or drives ---------------------------------------------------------

    def initialize(self) -> None:
        """Create the communicator (classic NCCL: the first collective does this)."""
        self.initialized = True

    def arrive(self) -> None:
        """Let a call held by the ``hang`` switch go on, late."""
        self._arrive.set()

    def buffer_intact(self) -> bool:
        """Whether the suspendable buffer is allocated and holds what it held at creation."""
        return self._buffer is not None and self._digest_of(self._buffer) == self._digest

    @property
    def suspended(self) -> bool:
        return self.state == "suspended"

    # -- the three calls ---------------------------------------------------------------------

    def memory_stats(self) -> dict[str, int]:
        with self._mutex:
            return self._call("memory_stats", self._memory_stats)

    def suspend(self) -> None:
        self._maybe_hang("suspend")
        with self._mutex:
            self._call("suspend", self._suspend)

    def resume(self) -> None:
        self._maybe_hang("resume")
        with self._mutex:
            self._call("resume", self._resume)

    def abort(self) -> None:
        """Abort the comm (NCCL's abortFlag): a held or waiting suspend / resume raises."""
        self._record("abort", "ok")
        self.aborted = True
        self._arrive.set()
        self._gloo_backend().abort()

    # -- inside ------------------------------------------------------------------------------

    def _gloo_backend(self) -> Any:
        raise NotImplementedError

    def _record(self, op: str, outcome: str, devices: tuple[str, ...] = ()) -> None:
        CALLS.append(Call(self.label, op, self.state, outcome, devices))

    def _call(self, op: str, body: Callable[[], Any]) -> Any:
        state = self.state
        try:
            result = body()
        except BaseException as error:
            CALLS.append(Call(self.label, op, state, first_line(error)))
            raise
        CALLS.append(Call(self.label, op, state, "ok"))
        return result

    def _refuse_unavailable(self, what: str, *, host_side: bool = False) -> None:
        """Errors that come before anything else: no feature, no comm, a dead comm."""
        # In torch's order: the Backend default raises at once; ProcessGroupNCCL looks its
        # comm up first, and only NCCLComm's method knows that it was built without offload.
        kind = self.settings.unsupported
        if kind == "backend":
            raise RuntimeError(f"Backend {self.registered_name} does not support {what}")
        if not self.initialized:
            flavor = self.settings.flavor
            raise RuntimeError(UNINITIALIZED_NCCL2 if flavor == "nccl2" else UNINITIALIZED_CLASSIC)
        if kind == "old_nccl":
            raise RuntimeError(f"{what}() requires NCCL 2.29.7 or later")
        if host_side:
            return  # ncclCommMemStats reads host counters: a dead CUDA context does not matter
        if self.aborted:
            raise nccl_error("internal error", "NCCL communicator was aborted")
        if self.state == "faulted":
            raise dist.DistBackendError(self.fault or ILLEGAL_ADDRESS)

    def _memory_stats(self) -> dict[str, int]:
        self._refuse_unavailable("getMemoryStats", host_side=True)
        suspend, persist = self._stats_bytes
        return {
            "suspend": suspend,
            "suspended": 1 if self.state == "suspended" else 0,
            "persist": persist,
            "total": persist + suspend,
        }

    def _suspend(self) -> None:
        self._refuse_unavailable("suspend")
        if self.settings.unsupported == "split_share":
            raise nccl_error("invalid usage", SPLIT_SHARE)
        if self.state == "suspended":
            raise nccl_error("invalid usage", ALREADY_SUSPENDED)
        if self.state == "half-suspended":
            raise nccl_error(
                "internal error",
                "communicator memory is in an inconsistent state after a failed suspend",
            )
        self._barrier("suspend")
        if self.settings.applies(self.settings.fail_after_barrier, "suspend"):
            self._buffer = None  # freed; the host copy failed, so the content is gone
            self.state = "half-suspended"
            raise nccl_error(
                "unhandled system error",
                "Failed to allocate pinned host memory for the suspend backup (stand-in: "
                "failure after the suspend barrier)",
            )
        self._backup = bytes(self._buffer or b"")
        self._buffer = None
        self.state = "suspended"
        self.suspends += 1

    def _resume(self) -> None:
        self._refuse_unavailable("resume")
        if self.settings.unsupported == "split_share":
            raise nccl_error("invalid usage", SPLIT_SHARE)
        if self.state != "suspended":
            raise nccl_error("invalid usage", NOT_SUSPENDED)
        need = self._stats_bytes[0]
        free, _ = device_memory()
        if self.settings.oom_on_resume or free < need:
            raise nccl_error(
                "unhandled cuda error",
                f"Cuda failure 2 'out of memory' (cuMemCreate of {need} bytes with {free} free; "
                "stand-in: before the resume barrier)",
            )
        buffer = bytearray(self._backup or b"")  # NCCL maps the memory back before its barriers
        self._buffer = buffer
        try:
            self._barrier("resume")
            if self.settings.applies(self.settings.fail_after_barrier, "resume"):
                raise nccl_error(
                    "remote process exited or there was a network error",
                    "bootstrap allgather of the memory handles failed (stand-in: failure after "
                    "the resume barrier)",
                )
        except BaseException:
            self._buffer = None  # still suspended: a retry may succeed
            raise
        self._backup = None
        self.state = "awake"
        self.resumes += 1

    def _maybe_hang(self, call: str) -> None:
        if not self.settings.applies(self.settings.hang, call):
            return
        self._record(call, "held (never arrives)")
        self._arrive.wait()
        if self.aborted:
            raise nccl_error("internal error", f"NCCL communicator was aborted during {call}")
        self._arrive.clear()

    def _barrier(self, phase: str) -> None:
        """A real gloo barrier over the group, on the backend itself: no hook, no store."""
        timeout = self.settings.barrier_timeout
        opts = dist.BarrierOptions()
        opts.timeout = timedelta(days=7) if timeout is None else timedelta(seconds=timeout)
        work = self._gloo_backend().barrier(opts)
        pause = 0.0001
        while not work.is_completed():
            if self.aborted:
                raise nccl_error("internal error", f"NCCL communicator was aborted during {phase}")
            time.sleep(pause)
            pause = min(pause * 2, 0.002)
        try:
            work.wait()
        except dist.DistBackendError:
            raise
        except RuntimeError as error:
            raise nccl_error(
                "remote process exited or there was a network error", f"{phase} barrier: {error}"
            ) from error

    def _resident(self) -> int:
        return len(self._persist) + (len(self._buffer) if self._buffer is not None else 0)

    def _fill(self, buffer: bytearray) -> bytearray:
        seed = hashlib.sha256(f"{self.label}/{self.group_rank}".encode()).digest()
        if buffer:
            buffer[: len(seed)] = seed[: len(buffer)]
            buffer[-1] = self.group_rank % 256
        return buffer

    @staticmethod
    def _digest_of(buffer: bytearray) -> str:
        return hashlib.sha256(buffer).hexdigest()

    # -- collectives (variant B, and accelerator tensors on variant A) -----------------------

    def _enter(self, op: str, tensors: Iterable[Any] = ()) -> None:
        """Check a collective against the state, record it, and refuse it while asleep."""
        devices = tuple(sorted({t.device.type for t in tensors if isinstance(t, torch.Tensor)}))
        if self.state in ("suspended", "half-suspended", "faulted") or self.aborted:
            if self.state != "faulted":
                # What NCCL does is undefined; the likely outcome is a sticky CUDA fault.
                self.fault = (
                    f"{ILLEGAL_ADDRESS} ({op} on a {self.state} NCCL communicator; "
                    f"suspendable stand-in {self.label})"
                )
                self._record(op, "refused", devices)
                self.state = "faulted"
            else:
                self._record(op, "refused", devices)
            raise dist.DistBackendError(self.fault)
        self.initialized = True  # lazy init: the first collective creates the communicator
        self._sequence += 1
        self._record(op, "ok", devices)
