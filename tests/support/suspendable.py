"""A suspendable test backend: NCCL's ``suspend()`` / ``resume()`` / ``memory_stats()`` on gloo.

No GPU exists where the suite runs, so this module stands in for an NCCL communicator that
``ncclCommSuspend`` / ``ncclCommResume`` / ``ncclCommMemStats`` drive (torch's
``Backend.suspend`` / ``resume`` / ``memory_stats``). It models the protocol that
NCCL's source describes (``ncclCommSuspend``/``ncclCommResume``/``ncclCommMemStats``;
see ``docs/suspend-facts.md``), on CPU:

- ``memory_stats()`` returns exactly ``{"suspend", "suspended", "persist", "total"}``: the
  suspendable bytes (not decremented by a suspend), 0 or 1, the resident bytes, and their sum.
- ``suspend()`` and ``resume()`` are barriers over the group's members, with no timeout, as
  NCCL's bootstrap barriers are (a real gloo barrier, issued on the backend directly, so that
  no pre-hook and no store operation sees it). A member that never calls blocks the others.
- A second ``suspend()``, or ``resume()`` while awake, raises ``DistBackendError`` (NCCL's
  ``ncclInvalidUsage``: "Already suspended" / "Not in suspended state") *before* the barrier.
- Suspend copies a real CPU buffer of the configured size to a host backup and frees it (NCCL:
  copy to pinned host memory, unmap); resume allocates it again, copies it back and checks it.
  ``device_memory()`` / ``memory_probe()`` report a pretend device whose free bytes go up and
  down with those buffers, for ``reloadpg_autopatch.set_memory_probe``.

Two variants:

- **A, ``"suspendable"``** (torch 2.13 and 2.14): :class:`SuspendableGloo`, a Python subclass of
  ``ProcessGroupGloo``. ``group._get_backend(torch.device("cpu"))`` returns the Python object,
  so ``suspend`` / ``resume`` / ``memory_stats`` reach Python; collectives run in C++ gloo and
  never reach Python. torch 2.13 forgets a Python subclass whose object nobody references (it
  hands back the plain C++ ``ProcessGroupGloo``); :data:`BACKENDS` keeps every one referenced.
- **B, ``"suspendable_py"``** (torch 2.14 only; :func:`python_backend_available`):
  :class:`SuspendablePy`, a pure-Python ``torch._C._distributed_c10d.Backend``. Collectives
  dispatched from C++ reach Python; it records each in :data:`CALLS` and delegates to a gloo
  backend it owns. A collective while suspended is refused the way a suspended NCCL comm would
  fail, with a sticky ``DistBackendError`` ("CUDA error: an illegal memory access ...").

Switches. Each backend reads them when it is created: first ``configure(...)`` (module level,
in the rank), then the environment, then the defaults. A test may also change
``backend.settings`` on a live backend. Environment values take ``VALUE`` (every rank) or
``VALUE@RANKS`` (``RANKS``: comma-separated global ranks, or ``*``):

==================================  ===============================================================
``SUSPENDABLE_BYTES``               suspendable bytes per backend (default 1 MiB)
``SUSPENDABLE_PERSIST_BYTES``       resident bytes per backend (default 256 KiB)
``SUSPENDABLE_FLAVOR``              ``classic`` (ProcessGroupNCCL) or ``nccl2``: the wording of
                                    the uninitialized error
``SUSPENDABLE_UNINITIALIZED``       ``1``: no communicator yet; ``memory_stats`` / ``suspend`` /
                                    ``resume`` raise ``RuntimeError("NCCL communicator not
                                    initialized.")`` until ``backend.initialize()`` or (variant B)
                                    its first collective, as classic NCCL's lazy init does
``SUSPENDABLE_UNSUPPORTED``         ``backend`` ("Backend <name> does not support suspend"),
                                    ``old_nccl`` ("getMemoryStats() requires NCCL 2.29.7 or
                                    later"), or ``split_share`` (stats work; suspend / resume
                                    raise ``ncclInvalidUsage`` before the barrier)
``SUSPENDABLE_HANG``                ``suspend``, ``resume`` or ``both``: that call never arrives
                                    (blocks, without holding the comm's lock, until
                                    ``backend.arrive()`` lets it go on late or ``backend.abort()``
                                    makes it raise)
``SUSPENDABLE_FAIL_AFTER_BARRIER``  ``suspend``, ``resume`` or ``both``: raise after the barrier.
                                    Suspend then leaves the comm half-suspended: memory freed,
                                    ``suspended`` still 0, the content lost; resume refuses ("Not
                                    in suspended state") and suspend refuses too. Resume leaves it
                                    suspended, so that a retry may succeed
``SUSPENDABLE_OOM_ON_RESUME``       ``1``: resume raises out-of-memory before the barrier even
                                    when the pretend device has room (it always does when not)
``SUSPENDABLE_BARRIER_TIMEOUT``     seconds before a suspend / resume barrier gives up; default
                                    none, as in NCCL
``SUSPENDABLE_DEVICE_TOTAL``        the pretend device's size in bytes (default 1 GiB; read at
                                    each query; ``set_device_total()`` wins; every rank)
``SUSPENDABLE_DEVICE_OCCUPIED``     bytes another tenant holds on it (default 0; read at each
                                    query; ``occupy()`` wins; every rank)
``SUSPENDABLE_ACCELERATOR``         the pretend accelerator's device type (default
                                    ``privateuseone``; read at import)
==================================  ===============================================================

Mixed groups (a CPU leg and a pretend accelerator leg, e.g.
``"cpu:gloo,privateuseone:suspendable"``): :func:`accelerator_tensor` wraps a CPU tensor in a
tensor subclass whose ``device`` is ``privateuseone:0`` (:data:`ACCELERATOR`), so that torch
routes its collectives to the group's backend for that device type. On torch 2.14 with
variant B as that backend (``"cpu:gloo,privateuseone:suspendable_py"``) the call goes through
torch's own dispatcher kernel (pre-hooks fire and see the accelerator tensors) and reaches
:class:`SuspendablePy`. With variant A (both lanes; the only choice on 2.13) the tensor's
``__torch_dispatch__`` records and refuses the call itself and runs it on the backend's gloo;
torch 2.14's pre-hooks then never see it. A barrier on a mixed group goes to the CPU leg.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend
from torch.utils._pytree import tree_map

NAME_A = "suspendable"
NAME_B = "suspendable_py"
KiB = 2**10
MiB = 2**20
GiB = 2**30

NCCL_VERSION = "2.30.7"
UNINITIALIZED_CLASSIC = "NCCL communicator not initialized."
UNINITIALIZED_NCCL2 = "ProcessGroupNCCL not initialized"
ALREADY_SUSPENDED = "Already suspended"
NOT_SUSPENDED = "Not in suspended state"
SPLIT_SHARE = "Memory suspend not supported with split_share communicators"
ILLEGAL_ADDRESS = "CUDA error: an illegal memory access was encountered"

#: Every backend this process created, in creation order. Keeps the Python objects alive: on
#: torch 2.13 a variant-A backend nobody references comes back from ``_get_backend`` as the
#: plain C++ ``ProcessGroupGloo``.
BACKENDS: list[_Protocol] = []
#: Every call that reached a backend in this process (lifecycle calls on both variants, and
#: collectives on variant B or through ``accelerator_tensor``), in order.
CALLS: list[Call] = []
_CREATED: collections.Counter[str] = collections.Counter()
_overrides: dict[str, Any] = {}
_lock = threading.Lock()


# ---- switches --------------------------------------------------------------------------------


@dataclasses.dataclass
class Settings:
    """What one backend does; read at creation (``configure`` > environment > default)."""

    suspend_bytes: int = 1 * MiB
    persist_bytes: int = 256 * KiB
    flavor: str = "classic"  # or "nccl2": the uninitialized message
    uninitialized: bool = False
    unsupported: str | None = None  # "backend", "old_nccl" or "split_share"
    hang: str | None = None  # "suspend", "resume" or "both"
    fail_after_barrier: str | None = None  # "suspend", "resume" or "both"
    oom_on_resume: bool = False
    barrier_timeout: float | None = None  # seconds; None: never, as in NCCL

    def applies(self, switch: str | None, call: str) -> bool:
        return switch in (call, "both")


_ENV = {
    "suspend_bytes": ("SUSPENDABLE_BYTES", int),
    "persist_bytes": ("SUSPENDABLE_PERSIST_BYTES", int),
    "flavor": ("SUSPENDABLE_FLAVOR", str),
    "uninitialized": ("SUSPENDABLE_UNINITIALIZED", "flag"),
    "unsupported": ("SUSPENDABLE_UNSUPPORTED", str),
    "hang": ("SUSPENDABLE_HANG", str),
    "fail_after_barrier": ("SUSPENDABLE_FAIL_AFTER_BARRIER", str),
    "oom_on_resume": ("SUSPENDABLE_OOM_ON_RESUME", "flag"),
    "barrier_timeout": ("SUSPENDABLE_BARRIER_TIMEOUT", float),
}
_CHOICES = {
    "flavor": {"classic", "nccl2"},
    "unsupported": {None, "backend", "old_nccl", "split_share"},
    "hang": {None, "suspend", "resume", "both"},
    "fail_after_barrier": {None, "suspend", "resume", "both"},
}


def _env_value(name: str, global_rank: int) -> str | None:
    """``VALUE`` or ``VALUE@RANKS`` from the environment, for this rank; None when unset."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    value, _, ranks = raw.partition("@")
    chosen = {int(r) for r in ranks.split(",") if r.strip()} if ranks not in ("", "*") else None
    if chosen is not None and global_rank not in chosen:
        return None
    return value


def _parse(kind: Any, text: str) -> Any:
    if kind == "flag":
        return text.lower() not in ("0", "false", "no", "off", "")
    return kind(text)


def _check(settings: Settings) -> Settings:
    for field, allowed in _CHOICES.items():
        if getattr(settings, field) not in allowed:
            raise ValueError(f"suspendable: {field}={getattr(settings, field)!r}, not in {allowed}")
    return settings


def settings_for(global_rank: int) -> Settings:
    """The settings a backend created now in this rank gets."""
    values: dict[str, Any] = {}
    for field, (env, kind) in _ENV.items():
        text = _env_value(env, global_rank)
        if text is not None:
            values[field] = _parse(kind, text)
    values.update(_overrides)
    return _check(Settings(**values))


def configure(**changes: Any) -> None:
    """Override switches (``Settings`` field names) for backends this rank creates from now on.

    They win over the environment; ``configure()`` with nothing, or ``reset()``, clears them.
    """
    unknown = set(changes) - {f.name for f in dataclasses.fields(Settings)}
    if unknown:
        raise TypeError(f"suspendable.configure(): unknown switches {sorted(unknown)}")
    if not changes:
        _overrides.clear()
        return
    _check(Settings(**{**_overrides, **changes}))
    _overrides.update(changes)


# ---- the pretend device ----------------------------------------------------------------------


class Figures(NamedTuple):
    """The pretend device's memory; the fields of ``reloadpg_autopatch.MemoryFigures``."""

    free: int
    total: int
    allocated: int
    reserved: int


class _Device:
    def __init__(self) -> None:
        self.total: int | None = None
        self.occupied: int | None = None

    def sizes(self) -> tuple[int, int]:
        total = self.total
        if total is None:
            total = int(os.environ.get("SUSPENDABLE_DEVICE_TOTAL", str(GiB)))
        occupied = self.occupied
        if occupied is None:
            occupied = int(os.environ.get("SUSPENDABLE_DEVICE_OCCUPIED", "0"))
        return total, occupied


_device = _Device()


def set_device_total(nbytes: int | None) -> None:
    """Size the pretend device (None: ``SUSPENDABLE_DEVICE_TOTAL`` or 1 GiB)."""
    _device.total = nbytes


def occupy(nbytes: int | None) -> None:
    """Let another tenant hold ``nbytes`` of the pretend device (None: the environment's)."""
    _device.occupied = nbytes


def resident_bytes() -> int:
    """Bytes the backends of this process hold on the pretend device now (real buffers)."""
    return sum(b._resident() for b in BACKENDS)


def host_backup_bytes() -> int:
    """Host bytes suspended backends hold (NCCL: the pinned host copies)."""
    return sum(len(b._backup) for b in BACKENDS if b._backup is not None)


def device_memory() -> tuple[int, int]:
    """``(free, total)`` bytes of the pretend device, like ``torch.cuda.mem_get_info``."""
    total, occupied = _device.sizes()
    return max(0, total - occupied - resident_bytes()), total


def memory_probe(device: Any = None) -> Any:
    """A probe for ``reloadpg_autopatch.set_memory_probe``: the pretend device's figures.

    Returns ``reloadpg_autopatch.MemoryFigures`` when the package imports, else
    :class:`Figures` (the same fields). The pretend device is one per process, whatever
    ``device`` is asked about.
    """
    free, total = device_memory()
    used = resident_bytes() + _device.sizes()[1]
    try:
        from reloadpg_autopatch import MemoryFigures
    except ImportError:
        return Figures(free, total, resident_bytes(), used)
    return MemoryFigures(free, total, resident_bytes(), used)


# ---- the call log ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Call:
    """One call that reached a suspendable backend."""

    backend: str  # "<name>#<serial>"
    op: str  # "suspend", "resume", "memory_stats", "allreduce", ...
    state: str  # the backend's state when the call came: "awake", "suspended", ...
    outcome: str  # "ok", "refused" (a collective while not awake) or "raised: <first line>"
    devices: tuple[str, ...] = ()  # the device types of the call's tensors


def calls(op: str | None = None, *, backend: Any = None, outcome: str | None = None) -> list[Call]:
    """The call log, filtered by op, backend (object or label) and outcome prefix."""
    label = backend.label if isinstance(backend, _Protocol) else backend
    return [
        c
        for c in CALLS
        if (op is None or c.op == op)
        and (label is None or c.backend == label)
        and (outcome is None or c.outcome.startswith(outcome))
    ]


def collectives(*, refused: bool | None = None) -> list[Call]:
    """Every collective in the log (lifecycle calls left out); ``refused`` filters."""
    out = [c for c in CALLS if c.op not in _LIFECYCLE]
    if refused is not None:
        out = [c for c in out if (c.outcome == "refused") == refused]
    return out


def creations(name: str | None = None) -> int:
    """How many times a creator of this module ran in this process (for one name, or all)."""
    return _CREATED[name] if name is not None else sum(_CREATED.values())


def backends(name: str | None = None) -> list[_Protocol]:
    """The backends this process created (for one registered name, or all)."""
    return [b for b in BACKENDS if name is None or b.registered_name == name]


def reset() -> None:
    """Forget the call log, the creation counts, ``configure()`` and the pretend device's
    settings (backends stay alive and referenced)."""
    CALLS.clear()
    _CREATED.clear()
    _overrides.clear()
    _device.total = None
    _device.occupied = None


_LIFECYCLE = frozenset({"suspend", "resume", "memory_stats", "abort", "shutdown"})


# ---- errors, as torch raises them ------------------------------------------------------------


def _nccl_error(kind: str, detail: str) -> dist.DistBackendError:
    """A ``DistBackendError`` worded like torch's ``C10D_NCCL_CHECK`` for an NCCL result."""
    heads = {
        "invalid usage": (
            "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
            "WARN",
        ),
        "unhandled cuda error": (
            "ncclUnhandledCudaError: Call to CUDA function failed.",
            "INFO",
        ),
        "unhandled system error": (
            "ncclSystemError: System call (e.g. socket, malloc) or external library call "
            "failed or device error.",
            "INFO",
        ),
        "internal error": ("ncclInternalError: Internal check failed.", "INFO"),
        "remote process exited or there was a network error": (
            "ncclRemoteError: A call failed possibly due to a network error or a remote "
            "process exiting prematurely.",
            "INFO",
        ),
    }
    head, level = heads[kind]
    return dist.DistBackendError(
        f"NCCL error in: suspendable (stand-in for NCCLUtils.cpp), {kind} (run with "
        f"NCCL_DEBUG={level} for details), NCCL version {NCCL_VERSION}\n{head}\n"
        f"Last error:\n{detail}"
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"raised: {type(error).__name__}: {text[0] if text else ''}"


# ---- the protocol, shared by both variants ---------------------------------------------------


class _Protocol:
    """The NCCL suspend protocol; the concrete classes give it a gloo backend to barrier on."""

    registered_name: str
    settings: Settings
    label: str
    _backup: bytes | None

    def _protocol_init(self, name: str, rank: int, size: int) -> None:
        global_rank = dist.get_rank() if dist.is_initialized() else rank
        self.registered_name = name
        self.group_rank, self.group_size, self.global_rank = rank, size, global_rank
        self.settings = settings_for(global_rank)
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
            CALLS.append(Call(self.label, op, state, _first_line(error)))
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
            raise _nccl_error("internal error", "NCCL communicator was aborted")
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
            raise _nccl_error("invalid usage", SPLIT_SHARE)
        if self.state == "suspended":
            raise _nccl_error("invalid usage", ALREADY_SUSPENDED)
        if self.state == "half-suspended":
            raise _nccl_error(
                "internal error",
                "communicator memory is in an inconsistent state after a failed suspend",
            )
        self._barrier("suspend")
        if self.settings.applies(self.settings.fail_after_barrier, "suspend"):
            self._buffer = None  # freed; the host copy failed, so the content is gone
            self.state = "half-suspended"
            raise _nccl_error(
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
            raise _nccl_error("invalid usage", SPLIT_SHARE)
        if self.state != "suspended":
            raise _nccl_error("invalid usage", NOT_SUSPENDED)
        need = self._stats_bytes[0]
        free, _ = device_memory()
        if self.settings.oom_on_resume or free < need:
            raise _nccl_error(
                "unhandled cuda error",
                f"Cuda failure 2 'out of memory' (cuMemCreate of {need} bytes with {free} free; "
                "stand-in: before the resume barrier)",
            )
        buffer = bytearray(self._backup or b"")  # NCCL maps the memory back before its barriers
        self._buffer = buffer
        try:
            self._barrier("resume")
            if self.settings.applies(self.settings.fail_after_barrier, "resume"):
                raise _nccl_error(
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
            raise _nccl_error("internal error", f"NCCL communicator was aborted during {call}")
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
                raise _nccl_error("internal error", f"NCCL communicator was aborted during {phase}")
            time.sleep(pause)
            pause = min(pause * 2, 0.002)
        try:
            work.wait()
        except dist.DistBackendError:
            raise
        except RuntimeError as error:
            raise _nccl_error(
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


# ---- variant A: a ProcessGroupGloo subclass --------------------------------------------------


class SuspendableGloo(_Protocol, dist.ProcessGroupGloo):
    """Variant A: gloo in C++ for collectives; suspend / resume / memory_stats in Python."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        dist.ProcessGroupGloo.__init__(self, store, rank, size, timeout)
        self._protocol_init(NAME_A, rank, size)
        # A group of its own whose CPU backend is this gloo: accelerator_tensor() runs
        # collectives of a pretend accelerator leg through it. No store traffic.
        self._shadow = dist.ProcessGroup(store, rank, size)
        self._shadow._register_backend(
            torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, self
        )

    def _gloo_backend(self) -> Any:
        return super(_Protocol, self)  # ProcessGroupGloo's own methods


# ---- variant B: a pure-Python Backend (torch 2.14) -------------------------------------------


def _hosts(value: Any) -> Any:
    """Replace accelerator_tensor wrappers by the CPU tensors they hold, in nested lists."""
    return tree_map(lambda x: x.host if isinstance(x, AcceleratorTensor) else x, value)


def _flat(*values: Any) -> Iterator[Any]:
    for value in values:
        if isinstance(value, (list, tuple)):
            yield from _flat(*value)
        else:
            yield value


class SuspendablePy(_Protocol, _C10dBackend):
    """Variant B: every collective torch dispatches reaches Python; gloo does the work."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        _C10dBackend.__init__(self, rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._protocol_init(NAME_B, rank, size)

    def _gloo_backend(self) -> Any:
        return self._gloo

    # torch 2.14.1 asserts without it ("getBackendName is not implemented").
    def getBackendName(self) -> str:
        return NAME_B

    # Without these, torch 2.14.1's trampoline finds the base class's property, calls it, and
    # the property calls the trampoline again: RecursionError (batch_isend_irecv reads
    # supports_coalescing).
    supports_coalescing = property(lambda self: False)
    supports_splitting = property(lambda self: False)
    supports_time_estimate = property(lambda self: False)
    supports_shrinking = property(lambda self: False)
    supports_reconfigure = property(lambda self: False)
    supports_window = property(lambda self: False)
    options = property(lambda self: self._gloo.options)

    def shutdown(self) -> None:
        self._record("shutdown", "ok")
        self._gloo.shutdown()

    def set_timeout(self, timeout: timedelta) -> None:
        self._gloo.set_timeout(timeout)

    # TORCH_DISTRIBUTED_DEBUG=DETAIL's _ProcessGroupWrapper reads these on every collective
    # ("Backend suspendable_py does not yet support sequence numbers" without them).
    def _set_sequence_number_for_group(self) -> None:
        self._sequence = 0

    def _get_sequence_number_for_group(self) -> int:
        return self._sequence

    def _run(self, op: str, method: str, *args: Any) -> Any:
        self._enter(op, _flat(*args))
        target = getattr(self._gloo, method)
        return target(*_hosts(list(args)))

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        return self._run("allreduce", "allreduce", tensors, *_opt(opts, dist.AllreduceOptions))

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        return self._run("allreduce_coalesced", "allreduce_coalesced", tensors, opts)

    def broadcast(self, tensors: Any, opts: Any = None) -> Any:
        return self._run("broadcast", "broadcast", tensors, *_opt(opts, dist.BroadcastOptions))

    def reduce(self, tensors: Any, opts: Any = None) -> Any:
        return self._run("reduce", "reduce", tensors, *_opt(opts, dist.ReduceOptions))

    def allgather(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self._run("allgather", "allgather", outputs, inputs, *_opt(opts, _AllgatherOptions))

    def all_gather_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        method = _gloo_name("all_gather_single", "_allgather_base")
        return self._run("all_gather_single", method, output, input, *_opt(opts, _AllgatherOptions))

    _allgather_base = all_gather_single

    def allgather_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        extra = _opt(opts, _AllgatherOptions)
        return self._run("allgather_coalesced", "allgather_coalesced", outputs, inputs, *extra)

    def all_gather_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        method = _gloo_name("all_gather_single_coalesced", "allgather_into_tensor_coalesced")
        extra = _opt(opts, _AllgatherOptions)
        return self._run("all_gather_single_coalesced", method, outputs, inputs, *extra)

    def gather(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self._run("gather", "gather", outputs, inputs, *_opt(opts, dist.GatherOptions))

    def scatter(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self._run("scatter", "scatter", outputs, inputs, *_opt(opts, dist.ScatterOptions))

    def reduce_scatter(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        extra = _opt(opts, dist.ReduceScatterOptions)
        return self._run("reduce_scatter", "reduce_scatter", outputs, inputs, *extra)

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        method = _gloo_name("reduce_scatter_single", "_reduce_scatter_base")
        extra = _opt(opts, dist.ReduceScatterOptions)
        return self._run("reduce_scatter_single", method, output, input, *extra)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        method = _gloo_name("reduce_scatter_single_coalesced", "reduce_scatter_tensor_coalesced")
        extra = _opt(opts, dist.ReduceScatterOptions)
        return self._run("reduce_scatter_single_coalesced", method, outputs, inputs, *extra)

    def all_to_all_single(
        self,
        output: Any,
        input: Any,
        output_splits: Any,
        input_splits: Any,
        opts: Any = None,
    ) -> Any:
        method = _gloo_name("all_to_all_single", "alltoall_base")
        extra = _opt(opts, dist.AllToAllOptions)
        return self._run(
            "all_to_all_single", method, output, input, output_splits, input_splits, *extra
        )

    alltoall_base = all_to_all_single

    def alltoall(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self._run("alltoall", "alltoall", outputs, inputs, *_opt(opts, dist.AllToAllOptions))

    def send(self, tensors: Any, dst: int, tag: int = 0) -> Any:
        return self._run("send", "send", tensors, dst, tag)

    def recv(self, tensors: Any, src: int, tag: int = 0) -> Any:
        return self._run("recv", "recv", tensors, src, tag)

    def recv_anysource(self, tensors: Any, tag: int = 0) -> Any:
        return self._run("recv_anysource", "recv_anysource", tensors, tag)

    def barrier(self, opts: Any = None) -> Any:
        return self._run("barrier", "barrier", *_opt(opts, dist.BarrierOptions))

    def monitored_barrier(self, opts: Any = None, wait_all_ranks: bool = False) -> None:
        # torch hands over BarrierOptions; gloo's binding takes the timeout.
        self._enter("monitored_barrier")
        timeout = opts.timeout if opts is not None else timedelta(seconds=1800)
        self._gloo.monitored_barrier(timeout, wait_all_ranks)


def _opt(opts: Any, kind: Any) -> tuple[Any, ...]:
    return (opts if opts is not None else kind(),)


def _gloo_name(new: str, old: str) -> str:
    return new if hasattr(dist.ProcessGroupGloo, new) else old


_AllgatherOptions = torch._C._distributed_c10d.AllgatherOptions


# ---- a pretend accelerator tensor ------------------------------------------------------------


#: The pretend accelerator's device type (``SUSPENDABLE_ACCELERATOR``). ``privateuseone``
#: needs no CUDA anywhere; with ``cuda``, torch's Python calls ``torch.cuda`` for some ops
#: (``dist.broadcast`` asks ``torch.cuda.get_device_capability``), which fails without a GPU.
ACCELERATOR = os.environ.get("SUSPENDABLE_ACCELERATOR", "privateuseone")


class AcceleratorTensor(torch.Tensor):
    """A CPU tensor that says it lives on an accelerator (``privateuseone:0`` by default).

    Only ``device`` is pretend: the data is ``.host``, a CPU tensor, and ordinary ops run on
    it. Its collectives go to the group's backend for that device type (see the module
    docstring). Functional collectives (``_c10d_functional``) are not supported.
    """

    host: torch.Tensor

    @staticmethod
    def __new__(cls, host: torch.Tensor, device: torch.device) -> AcceleratorTensor:
        made = torch.Tensor._make_wrapper_subclass(
            cls,
            host.shape,
            dtype=host.dtype,
            device=device,
            strides=host.stride(),
            requires_grad=False,
        )
        made.host = host
        return made

    def __repr__(self) -> str:  # type: ignore[override]
        return f"AcceleratorTensor({self.host!r}, device={self.device})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "namespace", "") == "c10d":
            return _accelerator_collective(func, args, kwargs)
        device = next(t.device for t in _flat(*args, *kwargs.values()) if isinstance(t, cls))
        if "device" in kwargs:
            kwargs = {**kwargs, "device": torch.device("cpu")}
        result = func(*_hosts(list(args)), **_hosts(kwargs))
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        if name.endswith("_") and args and isinstance(args[0], cls):
            return args[0]  # in place: the wrapper already shows the host's new values
        if name in ("_to_copy", "to", "_local_scalar_dense"):
            return result  # leaving the pretend device: plain CPU tensors
        return tree_map(lambda x: cls(x, device) if isinstance(x, torch.Tensor) else x, result)


def accelerator_tensor(host: torch.Tensor, device: str | torch.device | None = None) -> Any:
    """Wrap a CPU tensor so that torch sees it on ``device`` (default :data:`ACCELERATOR`,
    index 0 unless given)."""
    device = torch.device(device if device is not None else ACCELERATOR)
    if device.index is None:
        device = torch.device(device.type, 0)
    return AcceleratorTensor(host, device)


def _accelerator_collective(func: Any, args: Any, kwargs: Any) -> Any:
    boxed = next(a for a in _flat(*args) if type(a).__name__ == "ScriptObject")
    pg = dist.ProcessGroup.unbox(boxed)
    tensors = [t for t in _flat(*args) if isinstance(t, AcceleratorTensor)]
    device = tensors[0].device
    backend = pg._get_backend(device)
    python_key = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)
    if isinstance(backend, SuspendableGloo):
        # torch would hand these to C++ gloo, which cannot take a CUDA tensor: run the op on
        # this backend's own shadow group with the host tensors instead.
        backend._enter(func.overloadpacket.__name__, tensors)
        shadow = backend._shadow.boxed()

        def swap(x: Any) -> Any:
            if x is boxed:
                return shadow
            return x.host if isinstance(x, AcceleratorTensor) else x

        return func(*tree_map(swap, list(args)), **tree_map(swap, kwargs))
    # Variant B (or anything else): torch's own kernel for that device, pre-hooks and all.
    with torch._C._ExcludeDispatchKeyGuard(python_key):
        return func(*args, **kwargs)


# ---- creators and registration ---------------------------------------------------------------


def _created(backend: _Protocol) -> _Protocol:
    with _lock:
        BACKENDS.append(backend)
        _CREATED[backend.registered_name] += 1
    return backend


def create_a(store: Any, rank: int, size: int, timeout: timedelta) -> SuspendableGloo:
    """The creator registered for ``"suspendable"`` (torch's four-argument creator API)."""
    return _created(SuspendableGloo(store, rank, size, timeout))  # type: ignore[return-value]


def create_b(store: Any, rank: int, size: int, timeout: timedelta) -> SuspendablePy:
    """The creator registered for ``"suspendable_py"``."""
    return _created(SuspendablePy(store, rank, size, timeout))  # type: ignore[return-value]


@functools.cache
def python_backend_available() -> bool:
    """Whether this torch lets Python construct a ``Backend`` (2.14: yes; 2.13: no)."""
    try:
        _C10dBackend(0, 1)
    except TypeError:  # "No constructor defined!"
        return False
    return True


PYTHON_BACKEND_REASON = (
    "variant B needs a Python-constructible torch._C._distributed_c10d.Backend (torch 2.14); "
    f"torch {torch.__version__} says 'No constructor defined!'"
)


def register(devices: Iterable[str] = ("cpu",)) -> list[str]:
    """Register ``"suspendable"`` (and ``"suspendable_py"`` where it can exist); return names.

    ``devices`` is what ``new_group(backend="suspendable")`` gives the backend; a mixed group
    names its legs itself (``"cpu:gloo,privateuseone:suspendable"``), whatever ``devices`` says.
    """
    devices = list(devices)
    dist.Backend.register_backend(NAME_A, create_a, devices=devices)
    names = [NAME_A]
    if python_backend_available():
        dist.Backend.register_backend(NAME_B, create_b, devices=devices)
        names.append(NAME_B)
    return names


register()
