"""The end of a world: the program destroyed WORLD, or replaced it behind our back.

torch tears down every group when WORLD is destroyed, so every record of that world ends for
good (a wrapper then says its world was destroyed), the registration and WORLD's stand-in end,
and the next world counts its cycles from 1 (``stepping.begin_world``). Groups that sleep
suspended are resumed first (a resume is collective, and every rank ends WORLD at the same
point): ``wake_before_world_ends``.
"""

from __future__ import annotations

import logging
from typing import Any

from torch.distributed import distributed_c10d as c10d

from .. import process, registry
from ..record import State
from ..runs import ReloadRun
from ..stepping import begin_world, nothing_to_do, threaded_world
from ..store import channel
from ..ways.wrapper import ReloadableProcessGroup, binding
from . import settings_round

logger = logging.getLogger("reloadpg_autopatch")


def check_world(holder: process.ProcessState) -> None:
    """End the records of a WORLD the program replaced without telling us."""
    known = registry.world()
    if known is not None and c10d._world.default_pg is not known:
        logger.info("WORLD was destroyed and replaced behind our back: its groups end")
        end_world()


def _forget(holder: process.ProcessState) -> None:
    """The registration ends, and so does WORLD's stand-in."""
    registered = holder.world.registration
    holder.world.registration = None
    settings_round.forget(holder.world)
    holder.world.facts = process.TorchDefault()
    holder.world.left_native = set()
    if registered is not None and registered.stand_in is not None:
        stand_in = registered.stand_in
        if c10d._world.default_pg is stand_in:  # torch's destroy clears it; this is not
            c10d._world.default_pg = None
        stand_in.group = None


def end_world() -> None:
    """WORLD is gone: torch tore down every group, and this world's records end for good."""
    if threaded_world():
        return  # nothing of ours belongs to a thread's world
    holder = process.current()
    with holder.lock:
        for record in registry.records():
            binding.unserve(record, destroy=False)  # torch destroyed every group, and its maps
            record.ended_with_world = True
            if record.state is not State.ENDED:
                record.move(State.ENDED)
        registry.prune()
        channel.tidy()
        _forget(holder)
        registry.belong_to(None, again=True)
        holder.ways = {}  # what each way kept belonged to the world that ended
        begin_world(holder)


def native_world() -> Any:
    """The native group serving as WORLD now (behind the stand-in when WORLD is swapped or
    suspended behind it)."""
    default = c10d._world.default_pg
    if isinstance(default, ReloadableProcessGroup):
        return default.group if default.group is not None else default._record.native
    return default


def destroy_group_or_world(destroy: Any, native: Any) -> Any:
    """torch's ``destroy_process_group`` (``destroy``) of ``native``: one group, or WORLD.

    Given WORLD (behind its stand-in or not), or nothing, torch destroys every group: the
    communicators that sleep suspended are resumed first, and this world's records end.
    """
    if native is not None and native is not native_world():
        return destroy(native)
    wake_before_world_ends()  # a suspended communicator is resumed first
    result = destroy()  # torch destroys every group
    end_world()
    return result


def wake_before_world_ends() -> None:
    """The program ends WORLD while groups sleep suspended: resume them first.

    By the SPMD contract every rank ends WORLD at the same point, so every member resumes
    each group (collective) before torch tears it down; no memory preflight: the memory goes
    away with the world. A forked child in its parent's world has nothing to resume.
    """
    holder = process.current()
    if nothing_to_do(holder, "destroy_process_group"):
        return
    asleep = [r for r in registry.records() if r.state is State.SUSPENDED]
    if not asleep:
        return
    run = ReloadRun()
    for record in asleep:
        record.way.resume(record, run)
    for name, error in run.failures:
        logger.error("resuming group %r before WORLD ends failed: %s", name, error)
