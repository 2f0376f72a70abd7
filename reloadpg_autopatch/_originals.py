"""torch's own ``torch.distributed`` callables, as they were before anything patched them.

The bottom of the import graph: the group lifecycle creates and destroys native groups with
these, the patching layer wraps them, and the sweep recognises stale references by identity
with them. The snapshot is taken once, the first time anything asks (the patch asks before
it replaces anything), from ``distributed_c10d`` (where torch defines them) and from the
``torch.distributed`` namespace (which re-exports them and adds a few of its own).
"""

from __future__ import annotations

import logging
import types
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

logger = logging.getLogger("reloadpg_autopatch")

_SNAPSHOT: dict[str, dict[str, Any]] = {}
#: Whether the patch replaced them in this process (a forked child inherits it, as it inherits
#: the patched torch): set by the patching layer, read by the lifecycle, which does nothing
#: useful in a process where no group can be reloadable.
_PATCHED = False


def note_patched() -> None:
    """The patch has replaced torch's callables in this process."""
    global _PATCHED
    _PATCHED = True


def patched() -> bool:
    """Whether the patch has replaced torch's callables in this process."""
    return _PATCHED


def _callables(module: types.ModuleType) -> dict[str, Any]:
    return {name: obj for name, obj in vars(module).items() if callable(obj)}


def snapshot() -> dict[str, dict[str, Any]]:
    """``{"namespace": {...}, "c10d": {...}}``: the callables of both modules before patching."""
    if not _SNAPSHOT:
        _SNAPSHOT["c10d"] = _callables(c10d)
        _SNAPSHOT["namespace"] = _callables(dist)
    return _SNAPSHOT


def original(name: str) -> Any:
    """torch's own ``torch.distributed.<name>`` (or ``distributed_c10d.<name>``)."""
    taken = snapshot()
    for where in ("c10d", "namespace"):
        if name in taken[where]:
            return taken[where][name]
    raise AttributeError(f"torch.distributed has no callable named {name!r}")


def destroy_native(group: Any) -> None:
    """Destroy a native group, tolerating one torch already tore down."""
    try:
        original("destroy_process_group")(group)
    except ValueError as error:  # "Invalid process group specified": already gone
        logger.debug("group %r was already destroyed: %s", group, error)
