"""The cycle and its phase: the one module that writes them, and the rules every step follows.

Destroy and reload are collective in the SPMD sense: every rank of WORLD calls them at the same
point of its program, as it calls ``new_group``, though ranks may arrive up to WORLD's timeout
apart. Both are idempotent: a second call in a row changes nothing. One runs at a time
(``one_step``), and only where this process holds groups (``nothing_to_do``). This module alone
writes the holder's cycle fields (``process.ProcessState``: the phase, the cycle and attempt
numbers, the step running, the last report, why a world was lost).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

from torch.distributed import distributed_c10d as c10d

from ..errors import StepInProgressError
from . import process, watchdog
from .process import Phase
from .report import CycleReport

logger = logging.getLogger("reloadpg_autopatch")


def threaded_world() -> bool:
    """Whether ranks are threads of this process (torch's threaded process groups).

    torch's ``MultiThreadedTestCase`` replaces ``_world`` with one world per thread. This
    package's state is per process, so there groups stay torch's own and destroy and reload
    have nothing to do: the gate changes nothing, as with the gate off.
    """
    return type(c10d._world) is not c10d._World


def nothing_to_do(holder: process.ProcessState, step: str) -> bool:
    """Whether this process holds no group that ``step`` could concern.

    A forked child in its parent's WORLD holds none (taking part would use the parent's store
    through an inherited socket, and wait for ranks that wait for the parent); nor does a
    threaded world (``threaded_world``).
    """
    if holder.in_parents_world:
        logger.debug("%s() in a forked child: its groups belong to the parent", step)
        return True
    if threaded_world():
        logger.debug("%s() with ranks as threads: their groups are torch's own", step)
        return True
    return False


@contextlib.contextmanager
def one_step(holder: process.ProcessState, step: str) -> Iterator[None]:
    """One destroy or reload at a time in this process, without holding a lock across it.

    The step waits for the other ranks (store syncs, group creations); a lock held all that
    time would block every other thread of this process that needs one, among them threads
    whose progress the other ranks wait for. The lock guards the flag only.
    """
    me = threading.get_ident()
    with holder.lock:
        running = holder.step
        if running is not None:
            if holder.step_thread == me:
                raise StepInProgressError(
                    f"{step}() was called from inside {running}(), in the same thread: a "
                    "reload hook (or code it runs) re-entered the step. Steps do not nest: "
                    f"call {step}() after {running}() has returned"
                )
            raise StepInProgressError(
                f"{step}() was called while {running}() is running in another thread of this "
                "process; destroy and reload are steps of the whole program: call them from "
                "one thread, after the other has returned"
            )
        holder.step, holder.step_thread = step, me
    try:
        yield
    finally:
        holder.step, holder.step_thread = None, None


# ---- the cycle's numbers and phase ----------------------------------------------------------


def begin_destroy(holder: process.ProcessState) -> CycleReport | None:
    """A destroy begins: the first of a cycle starts the cycle (and its report; None for a
    destroy while asleep, which frees only what was made since)."""
    holder.lost = None
    first = holder.phase is Phase.AWAKE
    holder.move(Phase.DESTROYING)
    if not first:
        return None
    holder.cycle += 1
    holder.attempt = 0
    holder.last_report = CycleReport(holder.cycle, holder.worlds_ended)
    return holder.last_report


def end_destroy(
    holder: process.ProcessState, *, freed: bool = True, suspended: bool = False
) -> None:
    """The destroy ended (``freed``: it freed something, or the cycle was asleep already;
    ``suspended``: some communicator sleeps, which the reload will resume under the watchdog,
    so its thread may wait for it: one thread a cycle, not one a step)."""
    if holder.phase is Phase.DESTROYING:  # a lost WORLD has reset the phase already
        holder.move(Phase.ASLEEP if freed else Phase.AWAKE)
    if holder.phase is Phase.AWAKE or not suspended:
        watchdog.idle()  # nothing sleeps: no watchdog thread


def begin_reload(holder: process.ProcessState) -> bool:
    """A reload begins; False when there is nothing asleep to reload."""
    if holder.phase is not Phase.ASLEEP:
        return False
    holder.lost = None
    holder.move(Phase.RELOADING)
    holder.attempt += 1
    return True


def end_reload(holder: process.ProcessState, *, woke: bool) -> None:
    """The reload ended: awake, or (refused, failed) still asleep and callable again."""
    if holder.phase is Phase.RELOADING:  # a lost WORLD has reset the phase already
        holder.move(Phase.AWAKE if woke else Phase.ASLEEP)
    if holder.phase is Phase.AWAKE:
        watchdog.idle()  # nothing sleeps: no watchdog thread


def reload_report(holder: process.ProcessState) -> CycleReport:
    """The report of the cycle a reload ends (a fresh one if its destroy was not seen)."""
    last = holder.last_report
    if (
        last is None
        or last.cycle != holder.cycle
        or last.world != holder.worlds_ended
        or last.reload is not None
    ):
        holder.last_report = CycleReport(holder.cycle, holder.worlds_ended)
    return holder.last_report


def lose_world(why: str) -> None:
    """WORLD was lost half-way through a step: the next step's error says why."""
    process.current().lost = why


def begin_world(holder: process.ProcessState) -> None:
    """The world ended: the next world counts cycles from 1."""
    holder.phase = Phase.AWAKE
    watchdog.idle()
    holder.cycle = 0
    holder.attempt = 0
    holder.worlds_ended += 1
