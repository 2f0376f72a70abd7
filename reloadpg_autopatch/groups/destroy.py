"""``destroy_process_groups()``: free every reloadable group's communicator; the objects stay.

The first destroy of a cycle runs the before-destroy hooks, then syncs every rank through the
store (a group created just before the destroy may still be in some peer's handshake, and gloo
closes a group's sockets under it), then frees each record's communicator as
``decisions.destroy_step`` says, in reverse creation order, then swaps WORLD when it is
registered on an accelerator. A destroy while asleep frees only the groups made since.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from . import binding, hooks, inplace, memory, names, participants, process, report, world
from .decisions import DestroyFacts, DestroyStep, destroy_step
from .process import Phase
from .record import Record, State
from .stepping import nothing_to_do, one_step

logger = logging.getLogger("reloadpg_autopatch")


def facts(record: Record) -> DestroyFacts:
    """What the destroy's decision looks at for ``record``."""
    return DestroyFacts(record.state, record.way, binding.abandoned(record))


def _release_abandoned(record: Record) -> None:
    binding.drop_if_abandoned(record)


def _free_wrapped(record: Record) -> None:
    record.timeout = participants.group_timeout(record.native)
    binding.unserve(record, destroy=True)
    record.move(State.DESTROYED)


def _free_in_place(record: Record) -> None:
    record.timeout = participants.group_timeout(record.native)
    record.device = memory.device_of(record.native)
    inplace.release(record.native)
    record.move(State.DESTROYED)


#: How each step is carried out; the steps that free a communicator are listed in ``FREES``.
EXECUTE: dict[DestroyStep, Callable[[Record], None]] = {
    DestroyStep.NOTHING: lambda record: None,
    DestroyStep.RELEASE_ABANDONED: _release_abandoned,
    DestroyStep.FREE_WRAPPED: _free_wrapped,
    DestroyStep.FREE_IN_PLACE: _free_in_place,
}
FREES = frozenset({DestroyStep.FREE_WRAPPED, DestroyStep.FREE_IN_PLACE})


def concerned(holder: process.ProcessState) -> list[Any]:
    """The groups a destroy frees on this rank, WORLD first, then in creation order."""
    out = []
    registered = holder.world
    if registered is not None and (registered.swap or registered.in_place):
        out.append(c10d._world.default_pg)
    for record in holder.records:
        held = record.held
        if record.state is State.LIVE and record.member and held is not None:
            out.append(held)
    return out


def destroy_process_groups() -> None:
    """Free the communicators of every reloadable group; the group objects stay valid.

    With WORLD registered (``register_default_process_group``) and on an accelerator backend,
    WORLD is replaced by a temporary CPU WORLD after the ranks have synchronised. Reload hooks
    (``add_reload_hook``) run first; the cycle report (``last_cycle_report``) records the step.
    Before ``init_process_group`` there is no world and nothing to destroy: it does nothing.
    """
    started = time.perf_counter()
    holder = process.current()
    if nothing_to_do(holder, "destroy_process_groups"):
        return
    if not dist.is_initialized():
        logger.debug("destroy_process_groups() before init_process_group(): nothing to destroy")
        return
    failures: list[tuple[str, BaseException]] = []
    part = report.StepReport()
    cycle = None
    destroyed: list[str] = []
    with one_step(holder, "destroy_process_groups"):
        world.check_world(holder)
        holder.lost = None
        first = holder.phase is Phase.AWAKE
        holder.move(Phase.DESTROYING)
        try:
            if first:
                holder.cycle += 1
                holder.attempt = 0
                cycle = report.begin(holder)
                cycle.destroy = part
                cycle.measure("before_destroy")
                with part.phase("hooks"):
                    failures = hooks.run("before_destroy", concerned(holder))
                with part.phase("sync"):
                    participants.sync("destroy", "destroy", token=True)
            swapping = world.needs_swap()
            with part.phase("destroy"):
                for record in reversed(list(holder.records)):
                    step = destroy_step(facts(record))
                    EXECUTE[step](record)
                    if step in FREES:
                        destroyed.append(str(record.name))
            if swapping:
                with part.phase("swap"):
                    world.swap_out()
            elif first:
                world.release_in_place()
            for record in holder.records:
                if record.state is State.DESTROYED and record.published is not None:
                    # torch unregistered the name with the native group: whatever resolves it
                    # while destroyed (functional collectives, DTensor, a compiled graph) must
                    # get the group that says to reload, not "could not resolve".
                    names.publish(record.name, record.published)
        except BaseException:
            if holder.phase is Phase.DESTROYING:  # a lost WORLD has reset the phase already
                holder.move(Phase.ASLEEP if destroyed or not first else Phase.AWAKE)
            raise
        holder.move(Phase.ASLEEP)
    part.total_ms = (time.perf_counter() - started) * 1e3
    part.groups["destroyed"] = destroyed[::-1]
    if cycle is None:
        logger.info("destroyed %d more process groups in %.1f ms", len(destroyed), part.total_ms)
        return
    cycle.measure("after_destroy")
    report.log(cycle, "destroy")
    if failures:
        raise hooks.error_for("before_destroy", failures)
