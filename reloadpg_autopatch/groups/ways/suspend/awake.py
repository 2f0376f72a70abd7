"""The groups this rank leaves awake while a peer may suspend them: the suspend way's own state.

Under the ``auto`` wrap policy in ``suspend`` and ``auto`` modes, a group the policy leaves
torch's own is asked once it exists whether it can suspend (``decline``); where it cannot here
(its backends serve only the CPU, or cannot suspend), it stays torch's own and awake, and this
rank names it at every destroy's agreement, so that a peer that would suspend it does not enter
NCCL's barrier alone. The names live in the process holder's part for the ways (``ways``),
which a forked child and a new world start without.
"""

from __future__ import annotations

from typing import Any

from ... import process
from .capability import capability

#: This way's slot in the holder's ``ways`` part.
SLOT = "suspend: left awake"


def _names(holder: process.ProcessState) -> set[str]:
    return holder.ways.setdefault(SLOT, set())


def decline(native: Any) -> bool:
    """Whether a group the wrap policy left alone stays torch's own and awake here (it cannot
    suspend on this rank; then remembered, and named at every destroy)."""
    if capability(native).suspends:
        return False
    holder = process.current()
    with holder.lock:
        _names(holder).add(str(native.group_name))
    return True


def leave_awake(native: Any) -> Any:
    """Remember a group this rank leaves awake while a peer may suspend it; return it."""
    holder = process.current()
    with holder.lock:
        _names(holder).add(str(native.group_name))
    return native


def still_known() -> list[str]:
    """The groups this rank left awake that torch still knows (the others are forgotten)."""
    from torch.distributed import distributed_c10d as c10d

    holder = process.current()
    with holder.lock:
        names = _names(holder)
        if not names:
            return []
        names &= {str(name) for name in c10d._world.pg_names.values()}
        return sorted(names)
