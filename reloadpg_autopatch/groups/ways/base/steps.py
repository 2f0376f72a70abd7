"""How a way carries out each step it gives: one method per step, called by the drivers.

``destroy._carry_out`` and ``reload._carry_out`` call, for each step, the method below that
carries it out (``DESTROY`` and ``RELOAD`` list which one). The steps every way can be given have
a body here (nothing, forget, take part, keep awake, the in-place refusals); the others are each
way's own, and ``missing_steps`` finds, by running a way's decisions over every input they take,
any step the way can give without a method of its own to carry it out: ``ways.register`` refuses
such a way, so it never fails half-way through a cycle.
"""

from __future__ import annotations

import itertools
from typing import Any

from ....errors import ModeRefusedError
from ... import recreation
from ...decisions import DestroyFacts, DestroyStep, ReloadFacts, ReloadStep
from ...record import Record, State
from ...runs import DestroyRun, ReloadRun


class Steps:
    """A method per step. Those that raise ``NotImplementedError`` here are a way's own."""

    name: str
    note: Any  # ``appearance.Appearance.note``

    # ---- every way ----------------------------------------------------------------------------

    def nothing(self, record: Record, run: DestroyRun | ReloadRun) -> None:
        """Nothing to do: awake already, ended, or left to its members."""

    def forget(self, record: Record, run: ReloadRun) -> None:
        """Nobody holds it any more: it ends on every rank at once."""
        record.move(State.ENDED)
        self.note(run, "forgotten", record)

    def take_part(self, record: Record, run: ReloadRun) -> None:
        """Not ours, but a peer needs it: take part in its creation, keep nothing."""
        run.taken_part.append(recreation.create_again(record))
        self.note(run, "taken_part", record)

    def keep(self, record: Record, run: DestroyRun) -> None:
        """Kept awake and resident: its members would take different ways."""
        run.part.groups.setdefault("resident", []).append(f"{record.name} (ways differ)")

    def refuse_released_by_a_member(self, record: Record, run: ReloadRun) -> None:
        """Rebuilt in place, but a member released it: it cannot be rebuilt."""
        raise ModeRefusedError(
            f"group {record.name!r} cannot be rebuilt in place: a member released it with "
            "torch.distributed.destroy_process_group(); release it on every member"
        )

    def refuse_released_here(self, record: Record, run: ReloadRun) -> None:
        """Released here, but a peer still holds it and rebuilds it in place."""
        raise ModeRefusedError(
            f"group {record.name!r} was released on this rank but a peer still holds it: a "
            "group reloaded in place (native mode) can only be rebuilt with every member, so "
            "release it on every member, or use the wrapper mode"
        )

    def refuse_torn_down(self, record: Record, run: ReloadRun) -> None:
        """Rebuilt in place, but WORLD's restore tore its communicator down."""
        raise ModeRefusedError(
            f"group {record.name!r} reloads in place, but restoring the swapped WORLD tore its "
            "communicator down; register WORLD in native mode too, or use mode 'auto'"
        )

    def after_destroy(self, record: Record) -> None:
        """Once every record of a destroy is done (and WORLD swapped): settle what is left."""

    def broke(self, record: Record) -> None:
        """Its communicator was aborted (a free of the step outlived its deadline): it cannot
        be used again here."""
        if record.state in (State.LIVE, State.DESTROYED):
            record.move(State.BROKEN)

    # ---- each way's own -----------------------------------------------------------------------

    def release_abandoned(self, record: Record, run: DestroyRun) -> None:
        """The program dropped it: free it if live, and release it for good."""
        raise NotImplementedError(f"{self.name} has no release_abandoned")

    def free(self, record: Record, run: DestroyRun) -> None:
        """Free its communicator (behind its wrapper, or in place)."""
        raise NotImplementedError(f"{self.name} has no free")

    def suspend(self, record: Record, run: DestroyRun) -> None:
        """Guard it, then suspend its communicator."""
        raise NotImplementedError(f"{self.name} has no suspend")

    def guard(self, record: Record, run: DestroyRun) -> None:
        """Guard it; nothing to suspend (no communicator yet)."""
        raise NotImplementedError(f"{self.name} has no guard")

    def recreate(self, record: Record, run: ReloadRun) -> None:
        """Create it again under its name, and serve the program's object with it."""
        raise NotImplementedError(f"{self.name} has no recreate")

    def recreate_after_restore(self, record: Record, run: ReloadRun) -> None:
        """Made while asleep and torn down by WORLD's restore: create it again."""
        raise NotImplementedError(f"{self.name} has no recreate_after_restore")

    def rebuild(self, record: Record, run: ReloadRun) -> None:
        """Rebuild its communicator inside torch's own object."""
        raise NotImplementedError(f"{self.name} has no rebuild")

    def resume(self, record: Record, run: ReloadRun) -> None:
        """Resume its communicator and lift the guard (then release it, if asked meanwhile)."""
        raise NotImplementedError(f"{self.name} has no resume")


#: The method that carries out each destroy step (``destroy._carry_out`` calls it).
DESTROY = {
    DestroyStep.NOTHING: Steps.nothing,
    DestroyStep.RELEASE_ABANDONED: Steps.release_abandoned,
    DestroyStep.FREE_WRAPPED: Steps.free,
    DestroyStep.FREE_IN_PLACE: Steps.free,
    DestroyStep.SUSPEND: Steps.suspend,
    DestroyStep.GUARD: Steps.guard,
    DestroyStep.KEEP_RESIDENT: Steps.keep,
}
#: The method that carries out each reload step (``reload._carry_out`` calls it).
RELOAD = {
    ReloadStep.NOTHING: Steps.nothing,
    ReloadStep.FORGET: Steps.forget,
    ReloadStep.RECREATE: Steps.recreate,
    ReloadStep.RECREATE_AFTER_RESTORE: Steps.recreate_after_restore,
    ReloadStep.REBUILD_IN_PLACE: Steps.rebuild,
    ReloadStep.TAKE_PART: Steps.take_part,
    ReloadStep.LEAVE_TO_MEMBERS: Steps.nothing,
    ReloadStep.REFUSE_RELEASED_BY_A_MEMBER: Steps.refuse_released_by_a_member,
    ReloadStep.REFUSE_RELEASED_HERE: Steps.refuse_released_here,
    ReloadStep.REFUSE_TORN_DOWN: Steps.refuse_torn_down,
    ReloadStep.RESUME: Steps.resume,
    ReloadStep.RESUME_THEN_RELEASE: Steps.resume,
}
#: The steps each way carries out itself (their body here only raises).
OWN = frozenset(
    {
        Steps.release_abandoned,
        Steps.free,
        Steps.suspend,
        Steps.guard,
        Steps.recreate,
        Steps.recreate_after_restore,
        Steps.rebuild,
        Steps.resume,
    }
)


def _gives(way: Any) -> set[DestroyStep | ReloadStep]:
    """Every step ``way``'s decisions give, over every input they take."""
    from ...agreement import FREE, KEEP

    bools = (False, True)
    given: set[DestroyStep | ReloadStep] = set()
    common = way.common_ways()
    shared = (
        (None,)
        + (DestroyStep.FREE_WRAPPED,) * (FREE in common)
        + (DestroyStep.KEEP_RESIDENT,) * (KEEP in common)
    )
    for state, abandoned, verdict, agreed in itertools.product(
        State, bools, way.verdicts(), shared
    ):
        given.add(way.destroy_step(DestroyFacts(state, way, abandoned, verdict, agreed)))
    for state, *flags in itertools.product(State, *[bools] * 5):
        given.add(way.reload_step(ReloadFacts(state, way, *flags)))
    return given


def missing_steps(way: Any) -> list[str]:
    """The steps ``way`` can give that it has no method of its own for (none: it is whole)."""
    missing = set()
    for step in _gives(way):
        method = (DESTROY if isinstance(step, DestroyStep) else RELOAD)[step]
        if method in OWN and getattr(type(way), method.__name__) is method:
            missing.add(f"{step.value} ({method.__name__})")
    return sorted(missing)
