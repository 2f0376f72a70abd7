"""What suspend can do with a group, from what its backends answer.

``memory_stats()`` is local and cheap, and tells a backend that can suspend (initialized or not
yet) from one that cannot; the NCCL versions, the options a group was created with and the
environment that make suspend free nothing or refuse are checked too. Any backend that answers
is treated alike, whatever device it serves (a test backend exercises this code).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .... import _env
from ...backends import device_backends, holds_accelerator_memory
from .communicator import lazy_uninitialized, nonblocking

logger = logging.getLogger("reloadpg_autopatch")

_C10dBackend = getattr(torch._C, "_distributed_c10d", None)
_C10dBackend = getattr(_C10dBackend, "Backend", None)

#: The four figures ``memory_stats()`` returns (bytes, except ``suspended``: 0 or 1).
STATS = ("suspend", "suspended", "persist", "total")
#: What an uninitialized communicator answers (classic ProcessGroupNCCL, nccl2).
UNINITIALIZED = ("not initialized",)
#: The NCCL that added ``ncclCommSuspend``.
NCCL_WITH_SUSPEND = (2, 29, 7)

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
    lazy = lazy_uninitialized(backend)
    if lazy is not None:  # asking would make its communicator: a collective, not a probe
        return NOT_INITIALIZED, None, lazy
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


#: The environment variables that decide whether a group can suspend (``environment_refusal``).
VARIABLES = (
    "NCCL_CUMEM_ENABLE",
    "NCCL_DISABLE_MEM_MANAGER",
    "NCCL_COMM_SPLIT_SHARE_RESOURCES",
    "NCCL_COMM_SHRINK_SHARE_RESOURCES",
    "TORCH_NCCL_USE_COMM_NONBLOCKING",
)


def variables(environ: Any = None) -> dict[str, str]:
    """This rank's values of ``VARIABLES`` ("" unset): the destroy's agreement compares them
    across ranks, to name the one that makes a rank take another way."""
    environ = os.environ if environ is None else environ
    return {name: str(environ.get(name, "")).strip() for name in VARIABLES}


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


def version_refusal(backend: Any, device: Any = None) -> str | None:
    """NCCL older than 2.29.7, where the backend tells (its build and runtime NCCL versions),
    else where torch tells for a backend on a CUDA device; whatever the backend is called."""
    found = []
    for getter in ("get_build_nccl_version", "get_runtime_nccl_version"):
        call = getattr(type(backend), getter, None) or getattr(backend, getter, None)
        if callable(call):
            with contextlib.suppress(Exception):
                found.append((getter, _version(call())))
    if not found and getattr(device, "type", device) == "cuda":
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


def communicator_refusal(backend: Any) -> str | None:
    """What the communicator says of itself that makes suspend refuse it (nonblocking)."""
    return nonblocking(backend)


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
    #: ``memory_stats()`` summed over the legs that answered it (empty: none did).
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def suspends(self) -> bool:
        return bool(self.legs) and not self.refusals

    @property
    def cpu_only(self) -> bool:
        return not self.legs and not self.refusals

    @property
    def freed_share(self) -> float | None:
        """The share of its memory a suspend would free (``suspend / total``; None: unknown)."""
        total = self.stats.get("total", 0)
        return self.stats.get("suspend", 0) / total if total > 0 else None


def capability(native: Any) -> Capability:
    """Ask each backend of ``native`` (one call of ``memory_stats()`` each, local)."""
    found = Capability()
    seen: set[int] = set()
    for device, backend in device_backends(native):
        if id(backend) in seen:
            continue
        seen.add(id(backend))
        verdict, stats, why = probe(backend)
        name = _backend_name(backend)
        if verdict != UNSUPPORTED:
            refusal = (
                environment_refusal()
                or version_refusal(backend, device)
                or options_refusal(backend)
                or communicator_refusal(backend)
            )
            if refusal is None:
                found.legs.append((device, backend))
                found.answers.append(verdict)
                for key, value in (stats or {}).items():
                    found.stats[key] = found.stats.get(key, 0) + value
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


def min_freed_share() -> float:
    """``SLIME_RELOADABLE_PG_SUSPEND_MIN_FREED``, else the default; a bad value is reported once
    per process, and the default used."""
    raw = os.environ.get(_env.SUSPEND_MIN_FREED_ENV)
    if raw is not None and raw.strip():
        try:
            return _env.parse_suspend_min_freed(raw)
        except ValueError as error:
            if _env.first_report(_env.SUSPEND_MIN_FREED_ENV, raw):
                logger.warning("%s; using %g instead", error, _env.DEFAULT_SUSPEND_MIN_FREED)
    return _env.DEFAULT_SUSPEND_MIN_FREED


def suspend_refusal(group: Any, found: Capability | None = None) -> str | None:
    """Why ``group`` cannot suspend in place, or None when it can."""
    if not torch_can_suspend():
        return f"torch {torch.__version__} has no Backend.suspend (torch 2.12 and later)"
    found = found if found is not None else capability(group)
    if found.refusals:
        return "; ".join(found.refusals)
    if not found.legs:
        return "it has no backend that holds accelerator memory (a CPU backend stays awake)"
    return None
