"""Suspend in place: a communicator's memory given back and restored, the group object kept.

torch's ``Backend.suspend()`` / ``resume()`` / ``memory_stats()`` (NCCL's ``ncclCommSuspend``,
``ncclCommResume``, ``ncclCommMemStats``) free and restore an NCCL communicator's buffers
without destroying anything. Three things make that safe here, which torch and NCCL leave to
the caller:

- **capability from torch's answers**: ``memory_stats()`` is local and cheap, and tells a
  backend that can suspend (initialized or not yet) from one that cannot; the NCCL versions and
  the environment that make suspend free nothing or refuse are checked too. Any backend that
  answers is treated alike, whatever device it serves (a test backend exercises this code);
- **a guard while asleep**: nothing in torch or NCCL refuses a collective on a suspended
  communicator (its kernels read unmapped memory). On torch 2.14 a ``ProcessGroup`` pre-hook,
  registered only while the group sleeps, refuses every dispatcher path at no cost while awake;
  on torch 2.13 the group sits behind a wrapper whose empty fast slot refuses;
- **a watchdog**: suspend and resume are collective inside NCCL with no timeout. The store
  syncs around them make every rank arrive together, and a call stuck past the suspend
  timeout ends the process with its stacks, as torch's NCCL watchdog does, never a silent hang.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .. import _env
from ..errors import GroupSuspendedError
from .backends import device_backends, holds_accelerator_memory

logger = logging.getLogger("reloadpg_autopatch")

_C10dBackend = getattr(torch._C, "_distributed_c10d", None)
_C10dBackend = getattr(_C10dBackend, "Backend", None)

#: The four figures ``memory_stats()`` returns (bytes, except ``suspended``: 0 or 1).
STATS = ("suspend", "suspended", "persist", "total")
#: What an uninitialized communicator answers (classic ProcessGroupNCCL, nccl2).
UNINITIALIZED = ("not initialized",)
#: The NCCL that added ``ncclCommSuspend``.
NCCL_WITH_SUSPEND = (2, 29, 7)
#: The pre-hook id the guard registers under ("RPGS").
HOOK_ID = 0x52504753

OK, NOT_INITIALIZED, UNSUPPORTED = "ok", "uninitialized", "unsupported"


def torch_can_suspend() -> bool:
    """Whether the installed torch has ``Backend.suspend``, ``resume`` and ``memory_stats``."""
    return _C10dBackend is not None and all(
        hasattr(_C10dBackend, name) for name in ("suspend", "resume", "memory_stats")
    )


def torch_has_pre_hooks() -> bool:
    """Whether a ``ProcessGroup`` pre-hook can guard a sleeping group (torch 2.14 and later)."""
    return hasattr(dist.ProcessGroup, "register_pre_hook") and hasattr(
        dist.ProcessGroup, "unregister_pre_hook"
    )


# ---- what a backend can do ------------------------------------------------------------------


def probe(backend: Any) -> tuple[str, dict[str, int] | None, str]:
    """``(verdict, stats, why)`` from the backend's own ``memory_stats()``: local and cheap."""
    if not torch_can_suspend():
        return UNSUPPORTED, None, f"torch {torch.__version__} has no Backend.suspend"
    try:
        stats = backend.memory_stats()
    except Exception as error:
        text = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        if any(marker in text for marker in UNINITIALIZED):
            return NOT_INITIALIZED, None, text
        return UNSUPPORTED, None, text
    try:
        figures = {key: int(stats[key]) for key in STATS}
    except Exception:
        return UNSUPPORTED, None, f"memory_stats() answered {stats!r}, not {', '.join(STATS)}"
    return OK, figures, ""


def environment_refusal(environ: Any = None) -> str | None:
    """What in the environment makes a suspend free nothing or refuse (None: nothing)."""
    environ = os.environ if environ is None else environ

    def value(name: str) -> str:
        return str(environ.get(name, "")).strip().lower()

    if value("NCCL_CUMEM_ENABLE") == "0":
        return "NCCL_CUMEM_ENABLE=0: NCCL allocates with cudaMalloc, which suspend cannot free"
    if value("NCCL_DISABLE_MEM_MANAGER") not in ("", "0"):
        return "NCCL_DISABLE_MEM_MANAGER is set: NCCL refuses to suspend (ncclInvalidUsage)"
    for name in ("NCCL_COMM_SPLIT_SHARE_RESOURCES", "NCCL_COMM_SHRINK_SHARE_RESOURCES"):
        if value(name) == "1":
            return f"{name}=1: communicators share a memory manager, which NCCL cannot suspend"
    if value("TORCH_NCCL_USE_COMM_NONBLOCKING") in _env.ON_VALUES:
        return (
            "TORCH_NCCL_USE_COMM_NONBLOCKING=1: a nonblocking suspend returns ncclInProgress, "
            "which torch reports as an error (not yet measured)"
        )
    return None


def _version(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, tuple) and value and all(isinstance(v, int) for v in value):
        return value
    return None


def version_refusal(backend: Any) -> str | None:
    """NCCL older than 2.29.7, where torch tells (build and runtime), for an NCCL backend."""
    if "NCCL" not in type(backend).__name__.upper():
        return None
    found = []
    for getter in ("get_build_nccl_version", "get_runtime_nccl_version"):
        call = getattr(type(backend), getter, None)
        with contextlib.suppress(Exception):
            found.append((getter, _version(call())))
    if not found:
        with contextlib.suppress(Exception):
            found.append(("torch.cuda.nccl.version", _version(torch.cuda.nccl.version())))
    for where, version in found:
        if version is not None and version < NCCL_WITH_SUSPEND:
            shown = ".".join(map(str, version))
            return f"{where}() is {shown}: suspend needs NCCL 2.29.7 or later"
    return None


def options_refusal(backend: Any) -> str | None:
    """Options a group was created with that make NCCL refuse to suspend it."""
    config = getattr(getattr(backend, "options", None), "config", None)
    if config is None:
        return None
    with contextlib.suppress(Exception):
        if int(getattr(config, "split_share", 0)) == 1:
            return "pg_options.config.split_share=1: it shares its parent's memory manager"
    with contextlib.suppress(Exception):
        if int(getattr(config, "blocking", 1)) == 0:
            return "pg_options.config.blocking=0: nonblocking communicators are not measured"
    return None


@dataclass
class Capability:
    """What suspend can do with a group: its legs that sleep, and those that stay awake."""

    #: ``(device, backend)`` of each backend that can suspend (initialized or not yet).
    legs: list[tuple[Any, Any]] = field(default_factory=list)
    #: Device types of backends that serve the CPU and stay awake (gloo): they keep working.
    awake: list[str] = field(default_factory=list)
    #: Why an accelerator backend of the group cannot suspend (empty: none can't).
    refusals: list[str] = field(default_factory=list)
    #: What each leg answered, in ``legs``' order (``OK`` or ``NOT_INITIALIZED``).
    answers: list[str] = field(default_factory=list)

    @property
    def suspends(self) -> bool:
        return bool(self.legs) and not self.refusals

    @property
    def cpu_only(self) -> bool:
        return not self.legs and not self.refusals


def capability(native: Any) -> Capability:
    """Ask each backend of ``native`` (one call of ``memory_stats()`` each, local)."""
    found = Capability()
    seen: set[int] = set()
    for device, backend in device_backends(native):
        if id(backend) in seen:
            continue
        seen.add(id(backend))
        verdict, _stats, why = probe(backend)
        name = _backend_name(backend)
        if verdict != UNSUPPORTED:
            refusal = environment_refusal() or version_refusal(backend) or options_refusal(backend)
            if refusal is None:
                found.legs.append((device, backend))
                found.answers.append(verdict)
            else:
                found.refusals.append(f"{name}: {refusal}")
        elif device.type == "cpu" or not holds_accelerator_memory(name):
            found.awake.append(device.type)
        else:
            found.refusals.append(f"{name}: {why}")
    return found


def _backend_name(backend: Any) -> str:
    try:
        return str(backend.name())
    except Exception:
        return type(backend).__name__


# ---- what sleeps, and how it was put to sleep -----------------------------------------------


@dataclass
class Sleep:
    """One group's sleep: its legs, the figures around it, and how it is guarded."""

    #: ``(device, backend)`` suspended (empty: guarded only, nothing was initialized).
    legs: list[tuple[Any, Any]] = field(default_factory=list)
    #: Device types whose tensors stay allowed while asleep (a CPU leg: gloo).
    awake: list[str] = field(default_factory=list)
    #: ``memory_stats()`` per leg (summed over legs) before the suspend and after the resume.
    before: dict[str, int] = field(default_factory=dict)
    asleep: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)
    suspend_ms: float = 0.0
    resume_ms: float = 0.0
    #: A pre-hook guards the native group (torch 2.14); else a wrapper does.
    hooked: bool = False

    def need(self) -> int:
        """Bytes a resume allocates again on this rank (``suspend`` of every leg)."""
        return int(self.before.get("suspend", 0))

    def report(self) -> dict[str, Any]:
        return {
            "legs": sorted({str(device) for device, _ in self.legs}),
            "stats_before": dict(self.before),
            "stats_asleep": dict(self.asleep),
            "stats_after": dict(self.after),
            "suspend_ms": round(self.suspend_ms, 3),
            "resume_ms": round(self.resume_ms, 3),
        }


def stats_of(legs: list[tuple[Any, Any]]) -> dict[str, int]:
    """The legs' ``memory_stats()`` summed (``suspended``: how many legs say 1)."""
    total = dict.fromkeys(STATS, 0)
    for _device, backend in legs:
        verdict, stats, _why = probe(backend)
        if verdict == OK and stats is not None:
            for key in STATS:
                total[key] += 1 if key == "suspended" and stats[key] > 0 else stats[key]
    return total


# ---- the guard ------------------------------------------------------------------------------


def guard_error(label: str, op: str) -> GroupSuspendedError:
    return GroupSuspendedError(
        f"{label} is suspended ({op}): reloadpg_autopatch.destroy_process_groups() released "
        "its communicator's memory; call reloadpg_autopatch.reload_process_groups() on every "
        "rank first (or create groups after the reload)"
    )


def _any_asleep(awake: list[str], tensors: Any) -> bool:
    for tensor in tensors or ():
        kind = getattr(getattr(tensor, "device", None), "type", None)
        if kind is not None and kind not in awake:
            return True
    return False


def hook_on(native: Any, awake: list[str], error: Callable[[str], BaseException]) -> None:
    """Refuse every use of ``native`` while it sleeps: a pre-hook, on torch 2.14.

    A call whose tensors are all on a device type that stays awake (the CPU leg of a
    ``cpu:gloo,cuda:nccl`` group) goes through; a barrier goes through where the group has a
    CPU leg (torch sends it there); a split is refused where torch runs the hook for it
    (torch 2.14's ``split_group`` does not: see docs/suspend.md, bypasses).
    """

    def refuse_while_asleep(args: Any) -> None:
        op = getattr(getattr(args, "name", None), "name", None) or str(getattr(args, "name", "?"))
        if awake and op != "SPLIT":
            tensors = [*(args.input_tensors or ()), *(args.output_tensors or ())]
            if tensors and not _any_asleep(awake, tensors):
                return
            if not tensors and op == "BARRIER":
                return
        raise error(op)

    native.register_pre_hook(HOOK_ID, refuse_while_asleep)


def hook_off(native: Any) -> None:
    native.unregister_pre_hook(HOOK_ID)


# ---- suspend and resume, under a watchdog ---------------------------------------------------

#: How long after the watchdog faulthandler's own thread ends the process if the watchdog
#: itself could not run (the call held the GIL).
BACKSTOP_S = 5.0


def suspend_timeout(world_timeout: timedelta) -> float:
    """Seconds one suspend or resume may take: ``SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT``, else
    WORLD's timeout. A bad value warns and keeps WORLD's."""
    raw = os.environ.get(_env.SUSPEND_TIMEOUT_ENV, "").strip()
    if raw:
        try:
            return _env.parse_seconds(raw, _env.SUSPEND_TIMEOUT_ENV)
        except ValueError as error:
            logger.warning("%s; using WORLD's timeout, %s", error, world_timeout)
    return world_timeout.total_seconds()


def _expired(what: str, seconds: float) -> None:
    """The watchdog: a suspend or resume stuck in NCCL never becomes a silent hang."""
    message = (
        f"reloadpg_autopatch: {what} did not return within {seconds:g} s "
        f"({_env.SUSPEND_TIMEOUT_ENV}, or WORLD's timeout). Every rank had passed the step's "
        "store sync, so a peer failed or hangs inside NCCL's barrier; NCCL cannot time it "
        "out, so this process ends here (as torch's NCCL watchdog does). Stacks follow."
    )
    logger.critical("%s", message)
    with contextlib.suppress(Exception):
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        faulthandler.dump_traceback(all_threads=True)
    os.kill(os.getpid(), signal.SIGABRT)


@contextlib.contextmanager
def watched(what: str, seconds: float) -> Iterator[None]:
    timer = threading.Timer(seconds, _expired, args=(what, seconds))
    timer.daemon = True
    timer.start()
    backstop = True
    try:
        faulthandler.dump_traceback_later(seconds + BACKSTOP_S, exit=True)
    except Exception:  # faulthandler unavailable (stderr closed): the timer alone
        backstop = False
    try:
        yield
    finally:
        timer.cancel()
        if backstop:
            faulthandler.cancel_dump_traceback_later()


def call(backend: Any, op: str, what: str, seconds: float) -> float:
    """``backend.suspend()`` or ``backend.resume()`` under the watchdog; milliseconds taken."""
    started = time.perf_counter()
    with watched(what, seconds):
        getattr(backend, op)()
    return (time.perf_counter() - started) * 1e3
