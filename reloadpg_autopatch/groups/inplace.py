"""Reload in place: the same ``ProcessGroup`` object, its communicator released and rebuilt.

torch 2.14's ``ProcessGroup.reconfigure`` rebuilds a group's communicator inside the object the
program already holds, from one opaque handle per member (``get_reconfigure_handle``) and a
value that must be fresh on every (re)initialization. The members exchange their handles
through the store, under keys of this generation, and every member derives the same fresh
value from the world epoch, the generation and the group's name.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

from .._originals import original
from . import rendezvous, state, world


def release(group: Any) -> None:
    """Free the group's communicator; the object stays torch's registered group."""
    group.shutdown()


def _uuid(holder: state.ProcessState, name: str) -> int:
    digest = hashlib.sha256(f"{holder.epoch}/{holder.generation}/{name}".encode()).digest()
    return int.from_bytes(digest[:7], "big")  # fits the int64 torch takes


def rebuild(group: Any, name: str, timeout: timedelta | None) -> None:
    """Reconfigure ``group`` in place with its members' fresh handles (every member calls)."""
    holder = state.current()
    # One key written and one read per member; the last member to arrive combines them.
    handles = [
        handle.decode()
        for handle in rendezvous.exchange(
            world.base_store(),
            holder.key("handle", name),
            group.rank(),
            group.size(),
            group.get_reconfigure_handle(),
            # A missing member fails this within WORLD's timeout, not the group's own.
            timeout=min(timeout, world.world_timeout()) if timeout else world.world_timeout(),
            step=f"reload: handles of group {name!r}",
        )
    ]
    work = original("_reconfigure")(_uuid(holder, name), handles, group=group, timeout=timeout)
    if work is not None:
        work.wait()
