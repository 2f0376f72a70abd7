"""What a way says about its records in the agreement of each step, and what it needs."""

from __future__ import annotations

from typing import Any

from ...agreement import DestroyAnswers, ReloadAnswers
from ...record import Record, State
from ...runs import DestroyRun

#: States in which a member still holds its group (it is rebuilt, resumed or kept).
KEPT = (State.LIVE, State.DESTROYED, State.SUSPENDED, State.BROKEN)


class Answering:
    """This rank's answers about a record at a destroy and at a reload."""

    in_place: bool

    def common_ways(self) -> str:
        """The common ways it can take when a group's members would take different ways
        (``agreement.FREE``: freed behind its wrapper; ``KEEP``: kept awake for the cycle)."""
        return ""

    def answer_destroy(self, record: Record, answers: DestroyAnswers) -> None:
        """What this rank says about ``record`` at a destroy (most ways: nothing)."""

    @staticmethod
    def answer_destroy_for_rank(answers: DestroyAnswers) -> None:
        """What this rank says at a destroy beyond its records (once per kind of way)."""

    @staticmethod
    def after_destroy_agreement(run: DestroyRun) -> None:
        """Read and check what every rank agreed before anything sleeps (once per kind of
        way): its own section of the agreement, into ``run.scratch``."""

    def verdict(self, record: Record, run: DestroyRun) -> Any:
        """What the ranks agreed about ``record`` in this way's own section (``DestroyFacts``'
        ``verdict``): None for a way that asks nothing there."""
        return None

    def resume_need(self, record: Record) -> list[tuple[Any, int]]:
        """What waking ``record`` allocates again here: ``(device, bytes)`` (the preflight)."""
        return []

    def creates_nothing(self, record: Record) -> bool:
        """Whether its members create nothing at a reload (so neither do its non-members)."""
        return False

    def answer_reload(self, record: Record, answers: ReloadAnswers) -> None:
        """Held here or not, and whether a reload creates anything for it."""
        if record.member and record.state in KEPT:
            answers.held.append(record.name)
            if self.creates_nothing(record):
                answers.in_place.append(record.name)
        elif record.state is State.RELEASED and record.member:
            answers.takes_part = True
            if self.in_place:
                answers.released_in_place.append(record.name)
