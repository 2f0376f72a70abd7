"""Reload in place: the same ``ProcessGroup`` object, its communicator released and rebuilt.

torch 2.14's ``ProcessGroup.reconfigure`` rebuilds a group's communicator inside the object the
program already holds, from one opaque handle per member (``get_reconfigure_handle``) and a
value that must be fresh on every (re)initialization. The members exchange their handles
through the store, under keys of this cycle, and every member derives the same fresh value
from the cycle, the reload's token (the same on every rank, new in every world) and the
group's name.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

from .._originals import original
from . import participants, process, rendezvous


def release(group: Any) -> None:
    """Free the group's communicator; the object stays torch's registered group."""
    group.shutdown()


def _uuid(holder: process.ProcessState, name: str) -> int:
    digest = hashlib.sha256(holder.key("reload", "uuid", holder.token, name).encode()).digest()
    return int.from_bytes(digest[:7], "big")  # fits the int64 torch takes


def rebuild(group: Any, name: str, timeout: timedelta | None) -> None:
    """Reconfigure ``group`` in place with its members' fresh handles (every member calls)."""
    holder = process.current()
    bound = participants.world_timeout()
    # One key written and one read per member; the last member to arrive combines them.
    handles = [
        handle.decode()
        for handle in rendezvous.exchange(
            participants.base_store(),
            holder.key("reload", "handle", holder.token, name),
            group.rank(),
            group.size(),
            group.get_reconfigure_handle(),
            # A missing member fails this within WORLD's timeout, not the group's own.
            timeout=min(timeout, bound) if timeout else bound,
            step=f"reload: handles of group {name!r}",
            cycle=participants.where("reload"),
        )
    ]
    work = original("_reconfigure")(_uuid(holder, name), handles, group=group, timeout=timeout)
    if work is not None:
        work.wait()
