"""``destroy_process_groups()``: free every reloadable group's communicator; the objects stay.

The first destroy of a cycle runs the before-destroy hooks, then meets every rank through the
store in one round, the agreement (``agreement.DestroyAnswers``): a group created just before
the destroy may still be in some peer's handshake (gloo closes a group's sockets under it), and
every rank says, for each group that sleeps by suspend, whether it can, so that none enters
NCCL's untimed barrier alone. Then each record's way carries out the step
``decisions.destroy_step`` gives it: those that sleep in place first, in creation order (WORLD,
the first record, first), then those freed, in creation order too, WORLD last (its swap tears
down every group torch knows): one order on every rank, as NCCL 2.31's destroy, a barrier among
a communicator's members, needs. Every free runs under the watchdog (``frees``). A destroy while
asleep frees only the groups made since.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch.distributed as dist

from ..errors import ReleaseError, ReloadPGError, format_ranks
from . import (
    agreement,
    frees,
    hooks,
    process,
    registry,
    releases,
    report,
    stepping,
    ways,
)
from .agreement import DestroyAnswers
from .decisions import DestroyFacts, DestroyStep, destroy_step
from .record import Record, State
from .runs import DestroyRun, broken
from .store import channel
from .ways import common
from .ways.wrapper import binding
from .world.end import check_world

logger = logging.getLogger("reloadpg_autopatch")

#: The steps that leave a group asleep in place: first, in creation order, and only in the
#: destroy that begins a cycle (a group made while asleep waits for the next one, which asks
#: every rank first). The others free a communicator, in creation order, WORLD last.
IN_PLACE = frozenset({DestroyStep.SUSPEND, DestroyStep.GUARD, DestroyStep.KEEP_RESIDENT})


def facts(record: Record, run: DestroyRun) -> DestroyFacts:
    """What the destroy's decision looks at for ``record``."""
    verdict = record.way.verdict(record, run)
    shared = common.STEPS.get(run.shared.get(str(record.name), ""))
    return DestroyFacts(record.state, record.way, binding.abandoned(record), verdict, shared)


def concerned(holder: process.ProcessState) -> list[Any]:
    """The groups a destroy frees on this rank, WORLD first, then in creation order."""
    return [
        record.held
        for record in holder.records.all
        if record.state is State.LIVE and record.member and record.held is not None
    ]


def _agree(run: DestroyRun) -> None:
    """Every rank's answers, merged; every rank then knows each group's verdict."""
    answers = DestroyAnswers()
    answers.release_failed = releases.failures(run.releases)
    if answers.release_failed:
        answers.release_failed_ranks = [str(channel.global_rank())]
    common.answer_for_rank(answers)
    for answer in {type(way).answer_destroy_for_rank for way in ways.registered()}:
        answer(answers)
    for record in registry.records():
        record.way.answer_destroy(record, answers)
        common.answer(record, answers)
    run.agreed = agreement.exchange(answers)
    with channel.agreed_outcome():
        _refuse_failed_releases(run.agreed)
        for check in {type(way).after_destroy_agreement for way in ways.registered()}:
            check(run)
        common.settle(run)


def _refuse_failed_releases(agreed: DestroyAnswers) -> None:
    """A release raised on some rank: every rank refuses, before anything is freed."""
    if not agreed.release_failed:
        return
    ranks = sorted(int(r) for r in agreed.release_failed_ranks)
    raise ReleaseError(
        f"destroy_process_groups() ({channel.where('destroy')}): what borrows a "
        f"communicator could not be released on {'rank' if len(ranks) == 1 else 'ranks'} "
        f"{format_ranks(ranks)}: "
        f"{'; '.join(sorted(agreed.release_failed))}. The other releases ran; nothing was "
        "freed or suspended on any rank, and every group still works: fix the release (or "
        "the state it found) and call destroy_process_groups() again"
    )


def _carry_out(record: Record, step: DestroyStep, run: DestroyRun) -> None:
    """Have the record's way carry out ``step`` (``ways.base.steps.DESTROY`` lists which
    method carries out which step; ``ways.register`` checked the way has each)."""
    way = record.way
    with run.part.phase(way.phase(step)):
        match step:
            case DestroyStep.NOTHING:
                way.nothing(record, run)
            case DestroyStep.RELEASE_ABANDONED:
                way.release_abandoned(record, run)
            case DestroyStep.FREE_WRAPPED | DestroyStep.FREE_IN_PLACE:
                way.free(record, run)
            case DestroyStep.SUSPEND:
                way.suspend(record, run)
            case DestroyStep.GUARD:
                way.guard(record, run)
            case DestroyStep.KEEP_RESIDENT:
                way.keep(record, run)


def _free_order(records: list[Record]) -> list[Record]:
    """The order every rank frees in: creation order, the same on every rank (torch creates
    groups collectively), with the ways that must free last (WORLD's) at the end. NCCL 2.31's
    destroy waits for every member: two ranks freeing two shared groups in opposite orders
    would wait for each other for good."""
    return sorted(records, key=lambda record: record.way.frees_last)


def _free(record: Record, step: DestroyStep, run: DestroyRun) -> None:
    """Carry out a freeing step; once a free of this destroy is stuck, abort instead.

    A free that outlived its deadline (``frees``) means a peer is gone: every later destroy
    would wait for it too, so the communicators left are aborted, never destroyed, and left
    broken; the stuck free's error is raised once the step is done.
    """
    if run.stuck is not None:
        with frees.aborting():
            _carry_out(record, step, run)
        record.way.broke(record)
        return
    try:
        _carry_out(record, step, run)
    except ReloadPGError as error:
        if not frees.stuck(error):
            raise
        run.stuck = error
        record.way.broke(record)


def _asleep() -> bool:
    """Whether some group's communicator sleeps (suspended) after this destroy."""
    return any(record.state is State.SUSPENDED for record in registry.records())


def destroy_process_groups() -> None:
    """Free the communicators of every reloadable group; the group objects stay valid.

    With WORLD registered (``register_default_process_group``) and on an accelerator backend,
    WORLD is replaced by a temporary CPU WORLD after the ranks have synchronised, or suspended
    in place in suspend mode. Reload hooks (``add_reload_hook``) run first; the cycle report
    (``last_cycle_report``) records the step. Before ``init_process_group`` there is no world
    and nothing to destroy: it does nothing.
    """
    started = time.perf_counter()
    holder = process.current()
    if stepping.nothing_to_do(holder, "destroy_process_groups"):
        return
    if not dist.is_initialized():
        logger.debug("destroy_process_groups() before init_process_group(): nothing to destroy")
        return
    failures: list[tuple[str, BaseException]] = []
    run = DestroyRun()
    with stepping.one_step(holder, "destroy_process_groups"):
        check_world(holder)
        cycle = stepping.begin_destroy(holder)
        run.first = cycle is not None
        try:
            if cycle is not None:
                cycle.destroy = run.part
                cycle.measure("before_destroy")
                with run.part.phase("hooks"):
                    failures = hooks.run("before_destroy", concerned(holder))
                with run.part.phase("releases"):
                    run.releases = releases.run()
                run.part.releases = [outcome.to_dict() for outcome in run.releases]
                with run.part.phase("sync"):
                    _agree(run)
                for record in list(registry.records()):
                    step = destroy_step(facts(record, run))
                    if step in IN_PLACE:
                        _carry_out(record, step, run)
            for record in _free_order(list(registry.records())):
                step = destroy_step(facts(record, run))
                if step not in IN_PLACE:
                    _free(record, step, run)
            for record in registry.records():
                record.way.after_destroy(record)
            if run.stuck is not None:
                raise run.stuck
        except BaseException:
            stepping.end_destroy(
                holder, freed=bool(run.destroyed) or not run.first, suspended=_asleep()
            )
            raise
        stepping.end_destroy(holder, suspended=_asleep())
    run.part.total_ms = (time.perf_counter() - started) * 1e3
    run.part.groups["destroyed"] = list(run.destroyed)  # in the order freed
    if cycle is None:
        logger.info(
            "destroyed %d more process groups in %.1f ms", len(run.destroyed), run.part.total_ms
        )
        return
    cycle.sleep = {str(r.name): r.sleep.report() for r in registry.records() if r.sleep is not None}
    cycle.measure("after_destroy")
    report.log(cycle, "destroy")
    if run.failures:
        raise broken(run.failures, "suspend", "destroy")
    if failures:
        raise hooks.error_for("before_destroy", failures)
