"""The rules every destroy and reload follows: one at a time, and only where there is a world.

Destroy and reload are collective in the SPMD sense: every rank of WORLD calls them at the same
point of its program, as it calls ``new_group``, though ranks may arrive up to WORLD's timeout
apart. Both are idempotent: a second call in a row changes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

from ..errors import StepInProgressError
from . import process, world

logger = logging.getLogger("reloadpg_autopatch")


def nothing_to_do(holder: process.ProcessState, step: str) -> bool:
    """Whether this process holds no group that ``step`` could concern.

    A forked child in its parent's WORLD holds none (taking part would use the parent's store
    through an inherited socket, and wait for ranks that wait for the parent); nor does a
    threaded world (``world.threaded_world``).
    """
    if holder.in_parents_world:
        logger.debug("%s() in a forked child: its groups belong to the parent", step)
        return True
    if world.threaded_world():
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
