"""Suspend behind a wrapper (torch 2.13, which has no pre-hooks): the wrapper's empty fast slot
refuses every use while the group sleeps, and a group whose members cannot all suspend it falls
back to the wrapper way: destroyed behind its wrapper, created again at reload."""

from __future__ import annotations

from typing import ClassVar

from ...agreement import FREE, KEEP, ReloadAnswers
from ...decisions import DestroyStep, ReloadFacts, ReloadStep
from ...record import Record, State
from ...runs import DestroyRun, ReloadRun
from ..wrapper import WRAPPER, binding
from .guard import Sleep
from .way import Suspend


class SuspendWrapped(Suspend):
    """The same behind a wrapper, whose empty fast slot is the guard (torch 2.13: no hooks)."""

    name: ClassVar[str] = "suspend behind a wrapper"
    torch_object: ClassVar[bool] = False

    def explain(self) -> str:
        return (
            "suspend in place (its wrapper refuses it while asleep (torch 2.13 has no pre-hooks))"
        )

    def common_ways(self) -> str:
        return FREE + KEEP  # behind its wrapper, as the wrapper way

    def fallback_step(self) -> DestroyStep:
        return DestroyStep.FREE_WRAPPED  # destroyed behind its wrapper, created again

    def free_step(self) -> DestroyStep:
        return DestroyStep.FREE_WRAPPED  # freed behind its wrapper instead, created again

    def can_free_instead(self, record: Record) -> bool:
        return True  # behind its wrapper, as the wrapper way

    def wake_step(self, facts: ReloadFacts) -> ReloadStep:
        return ReloadStep.RECREATE

    def creates_nothing(self, record: Record) -> bool:
        return record.state is not State.DESTROYED  # resumed, or kept awake

    def guard_on(self, record: Record, sleep: Sleep, label: str) -> None:
        record.wrapper.sleep()

    def guard_off(self, record: Record) -> None:
        wrapper = record.wrapper
        if wrapper is not None:
            wrapper.wake()

    def answer_reload(self, record: Record, answers: ReloadAnswers) -> None:
        binding.drop_if_abandoned(record)
        super().answer_reload(record, answers)

    # A fallback, or a group made while asleep, lives behind its wrapper like any other.
    def release_abandoned(self, record: Record, run: DestroyRun) -> None:
        WRAPPER.release_abandoned(record, run)

    def free(self, record: Record, run: DestroyRun) -> None:
        WRAPPER.free(record, run)
        self.note_freed_instead(record, run)

    def recreate(self, record: Record, run: ReloadRun) -> None:
        WRAPPER.recreate(record, run)

    def recreate_after_restore(self, record: Record, run: ReloadRun) -> None:
        WRAPPER.recreate_after_restore(record, run)

    def after_destroy(self, record: Record) -> None:
        WRAPPER.after_destroy(record)


SUSPEND_WRAPPED = SuspendWrapped()
