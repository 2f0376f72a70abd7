"""Suspend: a communicator's memory given back and restored in place, the group object kept.

torch's ``Backend.suspend()`` / ``resume()`` (NCCL's ``ncclCommSuspend``/``ncclCommResume``)
free and restore an NCCL communicator's buffers without destroying anything. The ranks first
agree on every group (each member says whether it can: ``answer_destroy``), so that none enters
NCCL's untimed barrier alone; then a guard goes on (``guard``: a pre-hook on torch 2.14, the
wrapper's empty slot on 2.13) and the suspend runs under the watchdog. A group whose members'
answers differ falls back: kept resident where the program holds torch's own object, destroyed
behind its wrapper on 2.13; ``suspend`` mode refuses it on every rank instead
(``after_destroy_agreement``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from ...._env import MODE_ENV
from ....errors import GroupBrokenError, ModeRefusedError, ReloadPGError
from ... import mode
from ...agreement import KEEP, DestroyAnswers
from ...decisions import DestroyFacts, DestroyStep, ReloadFacts, ReloadStep
from ...memory import human
from ...record import Record, State
from ...runs import DestroyRun, ReloadRun
from ...store import channel
from ...watchdog import call
from ..base import Way
from ..inplace import IN_PLACE, in_place_refusal
from ..wrapper import binding
from .agreed import note_freed_instead, read_agreed, suspend_seconds, verdict_of
from .answers import SuspendAnswers
from .awake import still_known
from .capability import (
    OK,
    capability,
    min_freed_share,
    suspend_refusal,
    torch_can_suspend,
    variables,
)
from .guard import Sleep, guard_error, hook_off, hook_on, stats_of
from .verdicts import Verdict


class Suspend(Way):
    """Torch's own group, suspended in place and guarded by a pre-hook (torch 2.14)."""

    name: ClassVar[str] = "suspend"
    torch_object: ClassVar[bool] = True
    suspends: ClassVar[bool] = True

    # ---- choosing ----

    def refusal(self, group: Any) -> str | None:
        found = capability(group) if torch_can_suspend() else None
        return suspend_refusal(group, found)

    def stays_awake(self, group: Any) -> bool:
        """A group on CPU backends only holds no accelerator memory: left alone, awake."""
        return torch_can_suspend() and capability(group).cpu_only

    def strict_error(self, name: str, refusal: str) -> ModeRefusedError:
        return ModeRefusedError(
            f"{MODE_ENV}=suspend (or set_reload_mode('suspend')) but group {name!r} cannot be "
            f"suspended in place: {refusal}; use mode 'auto' to reload such groups another way"
        )

    def available(self) -> bool:
        return torch_can_suspend()

    def explain(self) -> str:
        return "suspend in place (a pre-hook refuses it while asleep)"

    def cannot(self, why: str) -> str:
        return f"; it cannot suspend: {why}"

    def phase(self, step: DestroyStep | ReloadStep) -> str:
        if step in (DestroyStep.SUSPEND, DestroyStep.GUARD, DestroyStep.KEEP_RESIDENT):
            return "suspend"
        if step in (ReloadStep.RESUME, ReloadStep.RESUME_THEN_RELEASE):
            return "resume"
        return super().phase(step)

    def problem(self, backend: str, why: str) -> str:
        return f"suspend mode cannot suspend {backend} groups: {why}"

    # ---- decisions ----

    def verdicts(self) -> tuple[Verdict | None, ...]:
        """Every verdict the agreement can give a suspend way (and none, before it answers)."""
        return (None, *Verdict)

    def sleep_step(self, facts: DestroyFacts) -> DestroyStep:
        verdict = facts.verdict if facts.verdict is not None else Verdict.FALLBACK
        if verdict is Verdict.SUSPEND:
            return DestroyStep.SUSPEND
        if verdict is Verdict.GUARD:
            return DestroyStep.GUARD
        if verdict is Verdict.FALLBACK:
            return self.fallback_step()
        if verdict is Verdict.FREE:
            return self.free_step()
        return DestroyStep.KEEP_RESIDENT

    def fallback_step(self) -> DestroyStep:
        """Some member cannot suspend it: nothing can destroy torch's own object, so it stays."""
        return DestroyStep.KEEP_RESIDENT

    def free_step(self) -> DestroyStep:
        """A suspend would give back little (``auto``): torch's own object is freed in place."""
        return DestroyStep.FREE_IN_PLACE

    def can_free_instead(self, record: Record) -> bool:
        """Whether this member can free the group instead of suspending it."""
        return in_place_refusal(record.native) is None

    def wake_step(self, facts: ReloadFacts) -> ReloadStep:
        """Destroyed, torch's own object was freed in place: it is rebuilt in place."""
        return self.in_place_wake_step(facts)

    def creates_nothing(self, record: Record) -> bool:
        return True  # resumed, kept awake, or rebuilt in place

    def common_ways(self) -> str:
        return KEEP  # torch's own object: never behind a wrapper

    # ---- the destroy's agreement ----

    def answer_destroy(self, record: Record, answers: DestroyAnswers) -> None:
        if not record.member:
            return
        name = str(record.name)
        answers = answers.section(SuspendAnswers)
        if binding.abandoned(record) or record.state is State.RELEASED:
            # Let go here (dropped, or destroy_process_group(g) while awake): no peer may
            # enter its barrier, which this rank will never join.
            answers.released.append(name)
            return
        if record.state is not State.LIVE:
            return
        found = capability(record.native)
        if found.refusals or not found.legs:
            answers.unsupported.append(name)
            answers.why.extend(f"group {name!r}: {why}" for why in found.refusals)
        for answer in set(found.answers):
            (answers.ok if answer == OK else answers.uninitialized).append(name)
        self._answer_share(record, found, answers)

    def _answer_share(self, record: Record, found: Any, answers: SuspendAnswers) -> None:
        """Outside ``suspend`` mode, a group a suspend would free little of is worth freeing
        instead (a one-rank or inter-node communicator keeps its network buffers asleep)."""
        share = found.freed_share
        if share is None or mode.get_reload_mode() == "suspend" or share >= min_freed_share():
            return
        name = str(record.name)
        answers.little.append(name)
        total = human(found.stats.get("total", 0))
        answers.little_why.append(f"{name}: a suspend would free {share:.0%} of its {total}")
        if not self.can_free_instead(record):
            answers.cannot_free.append(name)

    @staticmethod
    def answer_destroy_for_rank(answers: DestroyAnswers) -> None:
        left = still_known()
        if left:
            answers.section(SuspendAnswers).awake.extend(left)
        answers.settings.update(variables())

    @staticmethod
    def after_destroy_agreement(run: DestroyRun) -> None:
        """Each group's verdict, read once; ``suspend`` mode refuses, alike on every rank, a
        group some member cannot suspend (``agreed``)."""
        read_agreed(run)

    def verdict(self, record: Record, run: DestroyRun) -> Any:
        return verdict_of(record, run)

    # ---- sleeping ----

    def guard(self, record: Record, run: DestroyRun) -> None:
        """Guard it; nothing to suspend (no communicator yet)."""
        self._guard(record, suspend=False)
        run.part.groups.setdefault("guarded", []).append(str(record.name))

    def suspend(self, record: Record, run: DestroyRun) -> None:
        """Guard it, then suspend its communicator. A suspend that raises leaves it broken
        (still guarded) and the step goes on, so that no peer waits in NCCL's barrier for a
        group this rank skipped; the errors are raised once the step is done."""
        self._guard(record, suspend=True)
        run.part.groups.setdefault("suspended", []).append(str(record.name))
        sleep = record.sleep
        try:
            for device, backend in sleep.legs:
                what = f"suspend() of {self.label(record)} on {device} ({channel.where('destroy')})"
                sleep.suspend_ms += call(backend, "suspend", what, suspend_seconds(run))
            sleep.asleep = stats_of(sleep.legs)
        except Exception as error:
            record.move(State.BROKEN)
            run.failures.append((str(record.name), error))

    def free(self, record: Record, run: DestroyRun) -> None:
        """Freed in place instead of suspended; refused as destroyed until the reload."""
        IN_PLACE.free(record, run)
        label = self.label(record)
        hook_on(record.native, [], lambda op: self.use_error(record, label, op))
        self.note_freed_instead(record, run)

    def rebuild(self, record: Record, run: ReloadRun) -> None:
        hook_off(record.native)
        IN_PLACE.rebuild(record, run)

    def note_freed_instead(self, record: Record, run: DestroyRun) -> None:
        """Name a group freed instead of suspended, and why, in the destroy's report."""
        note_freed_instead(record, run)

    def keep(self, record: Record, run: DestroyRun) -> None:
        """Left awake and resident, and said so in the report."""
        if str(record.name) in run.shared:
            return super().keep(record, run)
        reason = (verdict_of(record, run) or Verdict.FALLBACK).value
        run.part.groups.setdefault("resident", []).append(f"{record.name} ({reason})")

    def _guard(self, record: Record, suspend: bool) -> None:
        """Refuse every use of the group from now on; then it may sleep."""
        found = capability(record.native)
        sleep = Sleep(legs=found.legs if suspend else [], awake=found.awake)
        sleep.before = stats_of(sleep.legs)
        self.guard_on(record, sleep, self.label(record))
        record.sleep = sleep
        record.move(State.SUSPENDED)

    def guard_on(self, record: Record, sleep: Sleep, label: str) -> None:
        def error(op: str) -> BaseException:
            if record.state is State.BROKEN:
                return GroupBrokenError(
                    f"{label} broke during a suspend or a resume ({op}) and cannot be used; "
                    "its communicator is in an unknown state: this process must restart"
                )
            return guard_error(label, op)

        hook_on(record.native, sleep.awake, error)
        sleep.hooked = True

    def guard_off(self, record: Record) -> None:
        hook_off(record.native)

    # ---- waking ----

    def resume_need(self, record: Record) -> list[tuple[Any, int]]:
        """What a resume allocates again on this rank: ``(device, bytes)`` per leg."""
        sleep = record.sleep
        if record.state is not State.SUSPENDED or sleep is None:
            return []
        share = sleep.need() // max(len(sleep.legs), 1)
        return [(device, share) for device, _backend in sleep.legs]

    def resume(self, record: Record, run: ReloadRun) -> None:
        """Resume it, then lift the guard (and release it, if the program asked while it
        slept: the resume is collective, so every member resumes it first)."""
        sleep = record.sleep
        try:
            for device, backend in sleep.legs:
                what = f"resume() of {self.label(record)} on {device} ({channel.where('reload')})"
                sleep.resume_ms += call(backend, "resume", what, suspend_seconds(run))
            sleep.after = stats_of(sleep.legs)
        except Exception as error:
            record.move(State.BROKEN)
            run.failures.append((str(record.name), error))
            return
        self.guard_off(record)
        record.move(State.LIVE)
        run.names["resumed"].append(str(record.name))
        if record.release_pending:  # every member resumed it (collective); now it goes, here
            binding.unserve(record, destroy=True)
            record.move(State.RELEASED)
            return
        held = self.held(record)
        if held is not None:
            run.rebuilt.append(held)

    def use_error(self, record: Record, label: str, what: str) -> ReloadPGError:
        if record.state is State.SUSPENDED:
            return guard_error(label, what)
        if record.state is State.BROKEN:
            return GroupBrokenError(
                f"{label} broke during a suspend or a resume and cannot be used ({what}); its "
                "communicator is in an unknown state: this process must restart"
            )
        return super().use_error(record, label, what)


SUSPEND = Suspend()
