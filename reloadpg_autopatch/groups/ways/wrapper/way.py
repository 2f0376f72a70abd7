"""Behind a wrapper: the program holds a ``ReloadableProcessGroup``; reload serves it a new group.

The default way, and the one every torch supports. A destroy destroys the native group behind
the wrapper (``binding.unserve``); the wrapper stays valid and refuses every use with an error
naming the fix until a reload creates the group again under its name (``recreation``) and
serves the wrapper with it. Its non-members take part in that creation, because torch creates
groups collectively. A wrapper the program dropped is released at the next step.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ... import backends, guard, names, recreation
from ...agreement import FREE, KEEP, ReloadAnswers
from ...decisions import DestroyFacts, DestroyStep
from ...record import Record, State
from ...runs import DestroyRun, ReloadRun
from ..base import Way
from .binding import drop_if_abandoned, serve, unserve


class Wrapper(Way):
    """Destroyed behind the wrapper, created again under its name at reload."""

    name: ClassVar[str] = "behind a wrapper"
    makes_anew: ClassVar[bool] = True

    def sleep_step(self, facts: DestroyFacts) -> DestroyStep:
        return DestroyStep.FREE_WRAPPED

    def refusal(self, group: Any) -> str | None:
        return None  # any group can live behind a wrapper

    def common_ways(self) -> str:
        return FREE + KEEP

    def answer_reload(self, record: Record, answers: ReloadAnswers) -> None:
        drop_if_abandoned(record)  # dropped by the program: released, not held
        super().answer_reload(record, answers)

    def release_abandoned(self, record: Record, run: DestroyRun) -> None:
        drop_if_abandoned(record)

    def free(self, record: Record, run: DestroyRun) -> None:
        record.timeout = backends.group_timeout(record.native)
        unserve(record, destroy=True)
        record.move(State.DESTROYED)
        self.note(run, "destroyed", record)

    def after_destroy(self, record: Record) -> None:
        if record.state is State.DESTROYED and record.published is not None:
            # torch unregistered the name with the native group: whatever resolves it while
            # destroyed (functional collectives, DTensor, a compiled graph) must get the group
            # that says to reload, not "could not resolve".
            names.publish(record.name, record.published)

    def recreate(self, record: Record, run: ReloadRun) -> None:
        native = recreation.create_again(record)
        serve(record, native)
        record.move(State.LIVE)
        recreation.replay(record, native)
        guard.arm(record.wrapper)  # the guard checks before its first call
        if record.held is not None:
            run.rebuilt.append(record.held)
        self.note(run, "rebuilt", record)

    def recreate_after_restore(self, record: Record, run: ReloadRun) -> None:
        # Restoring WORLD tore down every group, also those made while it slept.
        unserve(record, destroy=False)
        record.move(State.DESTROYED)
        self.recreate(record, run)


WRAPPER = Wrapper()
