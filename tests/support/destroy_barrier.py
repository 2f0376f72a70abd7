"""NCCL 2.31's destroy on gloo: a free that waits for every member, untimed, unless aborted.

From NCCL 2.31.2 on, ``ncclCommDestroy`` runs a barrier among the communicator's ranks on a
node before it frees anything (commDestroySync, NCCL commit 08016686e), with no timeout; only an
abort (the communicator's abort flag) skips it. torch's ``destroy_process_group(g)`` and
``ProcessGroup.shutdown()`` end there, and so does WORLD's destroy, which shuts every group torch
knows down. No GPU exists where the suite runs, so ``install(store)`` puts the same rule on every
gloo group of a rank (one node): each ``ProcessGroup.shutdown()`` of a group of two members or
more first counts itself in under a key of that incarnation of the group and waits, polling the
store, until every member has; ``ProcessGroup.abort()`` sets the group's flag, so a shutdown
waiting in the barrier returns at once, and one not begun yet skips it. torch calls both
methods from Python (``distributed_c10d``), which is where this model sits: gloo's C++ backend
never reaches a Python override of its own.

``die_in_free(n)``: this rank kills itself (SIGKILL) inside its ``n``-th free, before counting
itself in, as a rank that dies inside ``ncclCommDestroy`` would. ``abort_cannot_reach()``: an
abort no longer releases a waiting free, as where torch cannot abort from another thread.
``FREES`` records each free of this process: ``(group name, members, how)``, ``how`` being
``"destroyed"``, ``"skipped"`` (the group was aborted first) or ``"aborted while waiting"``;
``ABORTS`` names each group aborted.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

#: Every free of this process, in order: (group name, its global ranks, how it went).
FREES: list[tuple[str, list[int], str]] = []
#: The name of every group aborted in this process, in order.
ABORTS: list[str] = []
#: How often a waiting member polls the store.
POLL_S = 0.005

_state: dict[str, Any] = {
    "store": None,
    "die_at": None,
    "frees": 0,
    "installed": False,
    "abort_reaches": True,
}
_aborted: set[int] = set()
_incarnations: dict[str, int] = {}
_lock = threading.Lock()
_shutdown = dist.ProcessGroup.shutdown
_abort = dist.ProcessGroup.abort


def _members(group: Any) -> list[int]:
    ranks = c10d._world.pg_group_ranks.get(group)
    return sorted(ranks) if ranks is not None else []


def _barrier_shutdown(self: Any) -> Any:
    members = _members(self)
    name = str(self.group_name)
    if len(members) < 2 or _state["store"] is None:
        return _shutdown(self)
    with _lock:
        _incarnations[name] = _incarnations.get(name, 0) + 1
        key = f"destroy-barrier/{name}/{_incarnations[name]}"
        _state["frees"] += 1
        dying = _state["frees"] == _state["die_at"]
    if dying:
        os.kill(os.getpid(), signal.SIGKILL)  # inside its free, before it counts itself in
    if id(self) in _aborted:
        FREES.append((name, members, "skipped"))
        return _shutdown(self)
    store = _state["store"]
    arrived = _count(store, key, 1)
    while arrived is None or arrived < len(members):  # no timeout, as in NCCL
        if id(self) in _aborted:
            FREES.append((name, members, "aborted while waiting"))
            return _shutdown(self)
        time.sleep(POLL_S)
        arrived = _count(store, key, 1 if arrived is None else 0)
    FREES.append((name, members, "destroyed"))
    return _shutdown(self)


def _count(store: Any, key: str, add: int) -> int | None:
    """The members counted in so far (None: the store is gone; NCCL's own barrier does not
    go through the store, so a member then waits on, as for a peer that never comes)."""
    try:
        return int(store.add(key, add))
    except Exception:
        return None


def _flagging_abort(self: Any) -> Any:
    ABORTS.append(str(self.group_name))
    if not _state["abort_reaches"]:
        return None  # a backend whose abort cannot reach a destroy waiting in another thread
    _aborted.add(id(self))
    return _abort(self)


def install(store: Any) -> None:
    """Every gloo group's free in this rank waits for its members through ``store``."""
    _state["store"] = store
    if not _state["installed"]:
        dist.ProcessGroup.shutdown = _barrier_shutdown  # type: ignore[method-assign]
        dist.ProcessGroup.abort = _flagging_abort  # type: ignore[method-assign]
        _state["installed"] = True


def abort_cannot_reach() -> None:
    """From now on an abort reaches no destroy that waits (as where torch cannot abort a
    communicator from another thread): a free stuck in the barrier stays stuck."""
    _state["abort_reaches"] = False


def die_in_free(n: int) -> None:
    """This rank kills itself inside its ``n``-th free (counted from 1)."""
    _state["die_at"] = _state["frees"] + n
