"""Every communicator the package frees: never a wait without a deadline.

From NCCL 2.31 on, ``ncclCommDestroy`` is a barrier among the communicator's ranks on a node,
with no timeout, skipped only when the communicator was aborted (commDestroySync, NCCL commit
08016686e); torch's ``destroy_process_group`` and ``ProcessGroup.shutdown`` end there. A rank
that dies inside its free, or before it, would leave its peers waiting there for good. So every
free of the package (a destroy's, WORLD's swap, a reload's groups only taken part in, a
creation a mode refused) runs under the watchdog (``watchdog``), with the suspend timeout
(WORLD's by default); every rank frees in one order (``destroy``), so a free that outlives it
is stuck for good. Then, on the watchdog's thread:

1. this rank appends where it is stuck (the group and its members) to one store key of the
   step, waits up to ``GRACE_S`` for its peers to do the same, and reads the key back once:
   the ranks the stuck group waits for, directly or through a peer stuck in another group's
   free, that said nothing, never came (they died, or hang before their free);
2. it aborts the stuck communicator (``ProcessGroup.abort``: NCCL then skips the barrier), in
   a thread of its own; the free returns, and the destroy aborts, never destroys, what it had
   left to free (``aborting``) and raises ``PeerMissingError`` naming those ranks (or
   ``GroupBrokenError`` when every member is stuck too);
3. where the abort does not bring the free back within ``ABORT_S`` (torch cannot abort from
   another thread), the watchdog ends the process with one message naming the group and the
   ranks that never came.

Nothing of this costs the happy path a store operation: the marks are written only once a free
has outlived its deadline.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .._originals import destroy_native
from ..errors import GroupBrokenError, PeerMissingError, ReloadPGError, format_ranks
from . import process, stuck_peers, watchdog
from .faults import GRACE_S
from .store import channel, entries

logger = logging.getLogger("reloadpg_autopatch")

#: How long an aborted communicator's free may take to return before the process ends.
ABORT_S = 5.0
#: How often a stuck rank reads how many peers have said where they are stuck.
POLL_S = 0.2
#: The rank that hosts the store (``channel.STORE_HOST``): named when the store is gone.
STORE_HOST = channel.STORE_HOST


#: Set on the error a stuck free raises: the step that catches it aborts what it had left.
STUCK = "reloadpg_stuck_free"


def stuck(error: BaseException) -> bool:
    """Whether ``error`` is a free that outlived its deadline (its communicator aborted)."""
    return getattr(error, STUCK, False) is True


def aborting_now() -> bool:
    """Whether frees abort in this thread now (``aborting``)."""
    return _ABORTING.on


class _Aborting(threading.local):
    """Per thread: whether frees abort instead (a free of this step outlived its deadline)."""

    on = False


_ABORTING = _Aborting()


@contextlib.contextmanager
def aborting() -> Iterator[None]:
    """Frees in the block abort their communicator instead of destroying it: a free of this
    step is stuck, so a peer is gone and every destroy would wait for it."""
    saved, _ABORTING.on = _ABORTING.on, True
    try:
        yield
    finally:
        _ABORTING.on = saved


def label(name: Any, kwargs: dict[str, Any]) -> str:
    """How a stuck free names a recorded group: its name, and its description if it has one."""
    desc = kwargs.get("group_desc")
    return f"group {str(name)!r}" + (f" ({desc!r})" if desc else "")


def destroy(native: Any, label: str) -> None:
    """torch's ``destroy_process_group(native)``, under the watchdog (``abort`` while
    ``aborting``)."""
    if _ABORTING.on:
        _abort_group(native)
        return
    _watched(label, lambda: destroy_native(native), _members_of(native), native.abort)


def shutdown(native: Any, label: str) -> None:
    """``native.shutdown()`` (the object stays torch's group), under the watchdog."""
    if _ABORTING.on:
        native.abort()
        return
    _watched(label, native.shutdown, _members_of(native), native.abort)


def destroy_every_group(label: str, world_size: int) -> None:
    """torch's ``destroy_process_group()``: WORLD, and every group torch knows, each shut down
    by torch in its own order; on a stuck free every one of them is aborted. Never called while
    a destroy is aborting: WORLD's swap stays out of it then (``WorldSwap.free``)."""
    from torch.distributed import distributed_c10d as c10d

    from .._originals import original

    def abort_all() -> None:
        for group in list(c10d._world.pg_map):
            with contextlib.suppress(Exception):
                group.abort()

    every = list(range(world_size))
    _watched(label, original("destroy_process_group"), lambda: every, abort_all)


def _abort_group(native: Any) -> None:
    from torch.distributed import distributed_c10d as c10d

    try:
        c10d._abort_process_group(native)
    except ValueError:  # torch no longer knows it: abort the communicator itself
        with contextlib.suppress(Exception):
            native.abort()


def _members_of(native: Any) -> Callable[[], list[int]]:
    """The group's global ranks, read only if a free outlives its deadline (torch's map entry
    is taken now: torch deletes it after the shutdown it times)."""
    from torch.distributed import distributed_c10d as c10d

    ranks = c10d._world.pg_group_ranks.get(native)
    return lambda: sorted(ranks) if ranks is not None else []


def _watched(
    label: str, free: Callable[[], Any], members: Callable[[], list[int]], abort: Any
) -> None:
    holder = process.current()
    step = "reload" if holder.asleep and holder.step == "reload_process_groups" else "destroy"
    stuck = _Context(label, members, abort, step)
    seconds = watchdog.suspend_timeout(channel.world_timeout())
    with watchdog.watched(f"freeing {label}", seconds, stuck.expired) as watch:
        free()
    if watch.fired and watch.result is not None:
        raise watch.result


class _Context:
    """What the watchdog needs if the free outlives its deadline, taken before the free."""

    def __init__(self, label: str, members: Callable[[], list[int]], abort: Any, step: str) -> None:
        holder = process.current()
        self.label, self.members, self.abort, self.during = label, members, abort, step
        self.where = channel.where(step)
        self.store = channel.base_store()
        self.key = holder.key(step, "stuck")
        self.counter = f"{self.key}/count"
        self.rank = channel.global_rank()

    def expired(self, watch: watchdog.Watch) -> None:
        """On the watchdog's thread: find who never came, abort, or end the process."""
        watch.extend(GRACE_S + ABORT_S)
        members = self.members()
        missing, elsewhere = self._find(members)
        error = self._error(watch, members, missing, elsewhere)
        logger.error("%s", error)
        if watch.done.is_set():
            return  # it returned during the grace after all
        setattr(error, STUCK, True)
        watch.result = error
        threading.Thread(target=self._abort, name="reloadpg_autopatch-abort", daemon=True).start()
        if not watch.done.wait(ABORT_S):
            watchdog.end_process(
                f"reloadpg_autopatch: {error} Aborting its communicator did not bring the free "
                f"back within {ABORT_S:g} s (torch cannot abort it from another thread), so "
                "this process ends here. Stacks follow."
            )

    def _abort(self) -> None:
        try:
            self.abort()
        except Exception as error:  # the process ends after ABORT_S if the free stays stuck
            logger.error("aborting %s failed: %r", self.label, error)

    def _find(self, members: list[int]) -> tuple[list[int] | None, dict[int, str]]:
        """``(missing, elsewhere)``: the ranks the stuck free waits for that said nothing
        (None: the store is gone), and the peers it waits for that are stuck in another free.

        The entries (O(world) bytes) are read at most twice: once as many ranks as this group
        has members have said where they are stuck (a counter, polled, tells), and at the
        grace's end if some were missing then; every rank of a 4,096-rank world is stuck in
        WORLD's free at once."""
        deadline = time.monotonic() + GRACE_S
        try:
            self.store.append(self.key, stuck_peers.entry(self.rank, self.label, members))
            said = self.store.add(self.counter, 1)
            while said < len(members) and time.monotonic() < deadline:
                time.sleep(POLL_S)
                said = self.store.add(self.counter, 0)
            missing, elsewhere = self._read(members)
            if missing and time.monotonic() < deadline:
                time.sleep(deadline - time.monotonic())
                missing, elsewhere = self._read(members)
            return missing, elsewhere
        except Exception as error:  # the store's host died, or left
            logger.debug("cannot read who is stuck in %s: %r", self.where, error)
            return None, {}

    def _read(self, members: list[int]) -> tuple[list[int], dict[int, str]]:
        found = stuck_peers.read(entries.read(self.store, self.key))
        return stuck_peers.closure(self.rank, members, found)

    def _error(
        self,
        watch: watchdog.Watch,
        members: list[int],
        missing: list[int] | None,
        elsewhere: dict[int, str],
    ) -> ReloadPGError:
        call = "reload_process_groups()" if self.during == "reload" else "destroy_process_groups()"
        head = (
            f"{call} ({self.where}, rank {self.rank}): freeing {self.label} (ranks "
            f"{format_ranks(members)}) did not return within {watch.seconds:g} s (NCCL's "
            "destroy waits for every member, untimed)"
        )
        tail = (
            "Its communicator, and those this step had left to free, were aborted, never "
            "destroyed; this world cannot be reloaded: end it (the job restarts, or every "
            "rank calls torch.distributed.init_process_group() again)"
        )
        stuck = "".join(
            f"; rank {r} is stuck freeing {g}"
            for r, g in sorted(elsewhere.items())
            if g != self.label
        )
        if missing is None:
            return PeerMissingError(
                f"{head}: the store is unreachable, so its host, rank {STORE_HOST} (where "
                f"torch's rendezvous puts it), died or left. {tail}",
                [STORE_HOST],
                self.during,
            )
        if missing:
            return PeerMissingError(
                f"{head}: ranks {format_ranks(missing)} never reached it (they died, or hang "
                f"before their free){stuck}. {tail}",
                missing,
                self.during,
            )
        return GroupBrokenError(
            f"{head}: every member ({format_ranks(members)}) is stuck in it too{stuck}, so "
            f"NCCL or the network failed under it. {tail}"
        )
