"""A toy way, written for the tests: a group kept awake through every cycle.

It shows what adding a way takes: this one module and one ``ways.register`` call, touching no
module of the package. Its groups stay torch's own objects; a destroy leaves them resident and
names them in the report; a reload has nothing to do for them, and their non-members create
nothing for them either.
"""

from __future__ import annotations

from typing import ClassVar

from reloadpg_autopatch.groups import ways
from reloadpg_autopatch.groups.decisions import DestroyFacts, DestroyStep, ReloadFacts, ReloadStep
from reloadpg_autopatch.groups.record import Record
from reloadpg_autopatch.groups.runs import DestroyRun


class KeepAwake(ways.Way):
    """Never asleep: the group keeps its communicator, and every call works."""

    name: ClassVar[str] = "kept awake"
    torch_object: ClassVar[bool] = True

    def sleep_step(self, facts: DestroyFacts) -> DestroyStep:
        return DestroyStep.KEEP_RESIDENT

    def wake_step(self, facts: ReloadFacts) -> ReloadStep:
        return ReloadStep.NOTHING

    def creates_nothing(self, record: Record) -> bool:
        return True

    def keep(self, record: Record, run: DestroyRun) -> None:
        run.part.groups.setdefault("kept awake", []).append(str(record.name))


KEEP_AWAKE = ways.register(KeepAwake(), mode="keep-awake")
