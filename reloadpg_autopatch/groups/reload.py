"""``reload_process_groups()``: bring back, in creation order, every group some rank still holds.

Before touching anything, the ranks publish through the store which groups they still hold and
whether they have the memory to wake what sleeps in place (the agreement,
``agreement.ReloadAnswers``), so a group every rank let go of is dropped on every rank at once,
the creations stay aligned, and a rank short of memory makes every rank refuse alike before
anything wakes. Then each record's way carries out the step ``decisions.reload_step`` gives it,
in creation order: WORLD first (resumed, rebuilt, or swapped back, which tears down every group
torch knew), then every group (resumed, rebuilt in place, created again under the name it always
had with keys of this cycle, or only taken part in). The after-reload hooks run last.
"""

from __future__ import annotations

import logging
import time

import torch.distributed as dist

from ..errors import MemoryShortError, ReloadPGError, WorldLostError
from . import (
    agreement,
    frees,
    hooks,
    names,
    pools,
    preflight,
    process,
    registry,
    report,
    stepping,
)
from .agreement import ReloadAnswers
from .decisions import ReloadFacts, ReloadStep, reload_step
from .record import Record
from .runs import ReloadRun, broken
from .store import channel, written
from .world.end import check_world

logger = logging.getLogger("reloadpg_autopatch")

_Native = dist.ProcessGroup

#: The steps that create a group through torch (timed per group in the report).
CREATES = frozenset({ReloadStep.RECREATE, ReloadStep.RECREATE_AFTER_RESTORE, ReloadStep.TAKE_PART})
TIMED = CREATES | {ReloadStep.REBUILD_IN_PLACE}


class _Agreed:
    """The merged answers as sets, for one lookup per record."""

    def __init__(self, answers: ReloadAnswers) -> None:
        self.held = set(answers.held)
        self.in_place = set(answers.in_place)
        self.released_in_place = set(answers.released_in_place)


def facts(record: Record, agreed: _Agreed, torn_down: bool) -> ReloadFacts:
    """What the reload's decision looks at for ``record``."""
    return ReloadFacts(
        state=record.state,
        way=record.way,
        release_pending=record.release_pending,
        needed=record.name in agreed.held,
        peers_in_place=record.name in agreed.in_place,
        released_by_a_member=record.name in agreed.released_in_place,
        torn_down=torn_down,
    )


def _agree(run: ReloadRun) -> _Agreed:
    """Every rank publishes one entry and reads one merged entry: one round trip.

    Every rank gets the same answers, so every rank makes the same creations in the same order,
    and skips the same ones.
    """
    answers = ReloadAnswers()
    for record in list(registry.records()):
        record.way.answer_reload(record, answers)
    answers.short = preflight.short(registry.records())
    run.agreed = agreement.exchange(answers)
    return _Agreed(run.agreed)


def _not_initialized() -> ReloadPGError:
    lost = process.current().lost
    if lost is not None:
        return WorldLostError(f"reload_process_groups() cannot reload this world: {lost}")
    return ReloadPGError(
        "reload_process_groups() needs torch.distributed to be initialized: call "
        "torch.distributed.init_process_group() first (WORLD was never initialized, or "
        "the program destroyed it)"
    )


def reload_process_groups() -> None:
    """Recreate every destroyed group in creation order (WORLD first, when it was swapped).

    Reload hooks (``add_reload_hook``) run last, with the groups rebuilt; the memory guard
    checks before each rebuilt group's first collective; the cycle report records the step.
    """
    if not dist.is_initialized():
        raise _not_initialized()
    started = time.perf_counter()
    holder = process.current()
    if stepping.nothing_to_do(holder, "reload_process_groups"):
        return
    run = ReloadRun()
    with stepping.one_step(holder, "reload_process_groups"):
        check_world(holder)
        if not stepping.begin_reload(holder):
            return
        try:
            cycle = _reload(holder, run)
        except BaseException:
            stepping.end_reload(holder, woke=False)
            channel.step_failed()  # peers may still wait for this rank inside it
            raise
        stepping.end_reload(holder, woke=True)
        with run.part.phase("hooks"):
            failures = hooks.run("after_reload", run.rebuilt)
    run.part.total_ms = (time.perf_counter() - started) * 1e3
    run.part.groups.update({k: v for k, v in run.names.items() if v or k != "resumed"})
    cycle.sleep = {str(r.name): r.sleep.report() for r in registry.records() if r.sleep is not None}
    cycle.measure("after_reload")
    report.log(cycle, "reload")
    if run.failures:
        raise broken(run.failures, "resume", "reload")
    if failures:
        raise hooks.error_for("after_reload", failures)


def _carry_out(record: Record, step: ReloadStep, run: ReloadRun) -> None:
    """Have the record's way carry out ``step`` (``ways.base.steps.RELOAD`` lists which method
    carries out which step; ``ways.register`` checked the way has each)."""
    way = record.way
    match step:
        case ReloadStep.NOTHING | ReloadStep.LEAVE_TO_MEMBERS:
            way.nothing(record, run)
        case ReloadStep.FORGET:
            way.forget(record, run)
        case ReloadStep.RECREATE:
            way.recreate(record, run)
        case ReloadStep.RECREATE_AFTER_RESTORE:
            way.recreate_after_restore(record, run)
        case ReloadStep.REBUILD_IN_PLACE:
            way.rebuild(record, run)
        case ReloadStep.TAKE_PART:
            way.take_part(record, run)
        case ReloadStep.REFUSE_RELEASED_BY_A_MEMBER:
            way.refuse_released_by_a_member(record, run)
        case ReloadStep.REFUSE_RELEASED_HERE:
            way.refuse_released_here(record, run)
        case ReloadStep.REFUSE_TORN_DOWN:
            way.refuse_torn_down(record, run)
        case ReloadStep.RESUME | ReloadStep.RESUME_THEN_RELEASE:
            way.resume(record, run)


def _reload(holder: process.ProcessState, run: ReloadRun) -> report.CycleReport:
    pools.begin_reload()
    cycle = stepping.reload_report(holder)
    with run.part.phase("agreement"):
        agreed = _agree(run)
    if run.agreed.short:
        short = run.agreed.short
        shown = "; ".join(short[:8]) + (f"; and {len(short) - 8} more" if len(short) > 8 else "")
        with channel.agreed_outcome():
            raise MemoryShortError(
                f"reload_process_groups() ({channel.where('reload')}): {shown}. Nothing was "
                "resumed on any rank and the groups still sleep: free accelerator memory (for "
                "instance offload the rollout engine first) and call reload_process_groups() again"
            )
    # Only now is this attempt the cycle's reload: a refused one leaves the report (its
    # destroy's figures) to the retry.
    cycle.reload = run.part
    prefix = holder.key("reload", "groups", channel.token()) + "/"
    creations = written.recording("groups", prefix)
    for record in list(registry.records()):
        step = reload_step(facts(record, agreed, run.torn_down))
        begun = time.perf_counter()
        with run.part.phase(record.way.phase(step)):
            if step in CREATES:
                with names.keys_under(creations):
                    _carry_out(record, step, run)
            else:
                _carry_out(record, step, run)
        if step in TIMED:
            record.way.timed(run, record, (time.perf_counter() - begun) * 1e3)
    if run.agreed.takes_part:
        # gloo closes a group's sockets when it is destroyed: a peer still finishing its
        # side of the handshake would see "Connection closed by peer". Every rank has
        # finished every creation once all of them pass this point.
        with run.part.phase("sync"):
            channel.sync("reload", "created")
    for native in run.taken_part:
        if type(native) is _Native:
            frees.destroy(native, f"group {str(native.group_name)!r} (only taken part in)")
    registry.prune()
    return cycle
