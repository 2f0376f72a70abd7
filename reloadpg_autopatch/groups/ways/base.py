"""The interface of a way: how a group sleeps and wakes, and how it says so.

A record's way answers every question destroy and reload ask about the record, so the drivers
never look at which way it is:

- which step to take (``destroy_step``, ``reload_step``): pure, from the record's facts and
  what the ranks agreed. The shared rules are here; a way fills in what is its own (a live
  group at a destroy: ``sleep_step``; at a reload: ``wake_step``, ``elsewhere_step``,
  ``made_while_asleep_step``);
- what this rank says about the record in each step's agreement (``answer_destroy``,
  ``answer_reload``);
- how each step it gives is carried out: a method named after the step (``EXECUTE`` in
  ``destroy`` and ``reload`` maps a step to the name), taking the record and the run;
- whether it can take a group, why not, and how it explains itself (``refusal``,
  ``strict_error``, ``explain``: the one choice of ``ways.choose``, the doctor's words);
- what a use of the group while it has no native group raises (``use_error``).

A way is one object; ``ways.register`` makes it known. Adding one is one module.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ...errors import GroupBrokenError, GroupDestroyedError, ModeRefusedError, ReloadPGError
from .. import recreation
from ..agreement import DestroyAnswers, ReloadAnswers
from ..decisions import DestroyFacts, DestroyStep, ReloadFacts, ReloadStep
from ..record import Record, State
from ..runs import DestroyRun, ReloadRun

#: States in which a member still holds its group (it is rebuilt, resumed or kept).
KEPT = (State.LIVE, State.DESTROYED, State.SUSPENDED, State.BROKEN)


class Way:
    """One way a group sleeps and wakes. Subclasses set the flags and fill in the steps."""

    #: How reports, errors and the doctor name it.
    name: ClassVar[str] = "?"
    #: The program holds torch's own group object (no wrapper).
    torch_object: ClassVar[bool] = False
    #: Reload rebuilds the communicator inside torch's own object (native mode).
    in_place: ClassVar[bool] = False
    #: It answers at the destroy's agreement whether it can suspend.
    suspends: ClassVar[bool] = False
    #: Its free comes after every other one of a destroy (its swap tears down every group).
    frees_last: ClassVar[bool] = False

    def __repr__(self) -> str:
        return f"<way {self.name}>"

    # ---- choosing ----------------------------------------------------------------------------

    def available(self) -> bool:
        """Whether this torch can do it at all."""
        return True

    def refusal(self, group: Any, *, world_swaps: bool) -> str | None:
        """Why this way cannot take ``group`` (None: it can)."""
        return None

    def stays_awake(self, group: Any) -> bool:
        """Whether a group it cannot take is left alone, awake, rather than refused."""
        return False

    def strict_error(self, name: str, refusal: str, world_swaps: bool) -> ModeRefusedError:
        """The error of a mode that allows only this way, for a group it cannot take."""
        return ModeRefusedError(f"group {name!r} cannot be reloaded {self.name}: {refusal}")

    def explain(self) -> str:
        """What it does, for the doctor."""
        return self.name

    def cannot(self, why: str) -> str:
        """The doctor's words for why it did not take a group another way took."""
        return f"; not {self.name}: {why}"

    def problem(self, backend: str, why: str) -> str:
        """The doctor's problem line when a mode with this way alone refuses ``backend``."""
        return f"{self.name} cannot take {backend} groups: {why}"

    # ---- decisions (pure) --------------------------------------------------------------------

    def destroy_step(self, facts: DestroyFacts) -> DestroyStep:
        abandoned = facts.abandoned and not self.torch_object
        if abandoned and facts.state in (State.LIVE, State.DESTROYED):
            return DestroyStep.RELEASE_ABANDONED
        if facts.state is not State.LIVE:
            return DestroyStep.NOTHING
        if facts.shared is not None:
            return facts.shared  # its members' ways differ: the step they all agreed on
        return self.sleep_step(facts)

    def sleep_step(self, facts: DestroyFacts) -> DestroyStep:
        """What a destroy does with a live group of this way."""
        raise NotImplementedError

    def reload_step(self, facts: ReloadFacts) -> ReloadStep:
        state = facts.state
        if state in (State.ENDED, State.BROKEN):
            return ReloadStep.NOTHING
        if state is State.SUSPENDED:
            return ReloadStep.RESUME_THEN_RELEASE if facts.release_pending else ReloadStep.RESUME
        if state in (State.RELEASED, State.NON_MEMBER):
            return self.elsewhere_step(facts) if facts.needed else ReloadStep.FORGET
        if state is State.LIVE:
            return self.made_while_asleep_step(facts)
        return self.wake_step(facts)

    def wake_step(self, facts: ReloadFacts) -> ReloadStep:
        """A reload of a group a destroy freed on this member."""
        return ReloadStep.RECREATE

    def in_place_wake_step(self, facts: ReloadFacts) -> ReloadStep:
        """A reload of torch's own object whose communicator a destroy shut down in place."""
        if facts.world_restored:
            return ReloadStep.REFUSE_TORN_DOWN
        if facts.released_by_a_member:
            return ReloadStep.REFUSE_RELEASED_BY_A_MEMBER
        return ReloadStep.REBUILD_IN_PLACE

    def elsewhere_step(self, facts: ReloadFacts) -> ReloadStep:
        """A peer still holds a group this rank does not (released here, or not a member)."""
        if facts.peers_in_place and (facts.state is State.NON_MEMBER or self.suspends):
            return ReloadStep.LEAVE_TO_MEMBERS  # its members create nothing: nor does this rank
        return ReloadStep.TAKE_PART  # torch creates groups collectively

    def made_while_asleep_step(self, facts: ReloadFacts) -> ReloadStep:
        """A live group at a reload: made while asleep (torn down if WORLD was restored)."""
        return ReloadStep.RECREATE_AFTER_RESTORE if facts.world_restored else ReloadStep.NOTHING

    # ---- the agreements ----------------------------------------------------------------------

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
        """Check what every rank agreed before anything sleeps (once per kind of way)."""

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

    # ---- carrying out the steps any way can be given ---------------------------------------

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

    def after_destroy(self, record: Record) -> None:
        """Once every record of a destroy is done (and WORLD swapped): settle what is left."""

    def broke(self, record: Record) -> None:
        """Its communicator was aborted (a free of the step outlived its deadline): it cannot
        be used again here."""
        if record.state in (State.LIVE, State.DESTROYED):
            record.move(State.BROKEN)

    # ---- how it appears ----------------------------------------------------------------------

    def held(self, record: Record) -> Any:
        """The group object the program holds: torch's own, or the wrapper."""
        return record.native if self.torch_object else record.wrapper

    def label(self, record: Record) -> str:
        """How messages name the group: its description or name, and its ranks."""
        wrapper = record.wrapper
        if wrapper is not None:
            return wrapper.describe()
        desc = record.kwargs.get("group_desc")
        try:
            import torch.distributed as dist

            ranks = dist.get_process_group_ranks(record.native)
        except Exception:  # torch no longer knows it: the name says enough
            ranks = None
        shown = f"group {desc!r}" if desc else f"group {record.name!r}"
        return shown + (f" (ranks {ranks})" if ranks is not None else "")

    def describe(self, record: Record, ranks: list[int]) -> str:
        """How its wrapper names itself."""
        desc = record.kwargs.get("group_desc")
        label = f"'{desc}' " if desc else ""
        return f"ReloadableProcessGroup {label}(ranks {ranks})"

    def releasable(self, record: Record) -> bool:
        """Whether ``destroy_process_group(g)`` lets this group go (WORLD's ends the world)."""
        return True

    def use_error(self, record: Record, label: str, what: str) -> ReloadPGError:
        """The error for using the group while it has no native group."""
        if record.state is State.BROKEN:
            return GroupBrokenError(
                f"{label} cannot be used ({what}): its communicator was aborted when a free "
                "of its destroy outlived its deadline (a peer never came); this world cannot "
                "be reloaded: end it, and start again"
            )
        if record.state is State.ENDED and record.ended_with_world:
            return GroupDestroyedError(
                f"{label} belonged to a WORLD that was destroyed "
                "(torch.distributed.destroy_process_group()) and cannot be used "
                f"({what}); its world was destroyed: create a new group in the current world"
            )
        if record.state in (State.RELEASED, State.ENDED):
            return GroupDestroyedError(
                f"{label} was released with torch.distributed.destroy_process_group() "
                f"and cannot be used ({what}); create a new group instead"
            )
        return GroupDestroyedError(
            f"{label} is destroyed and cannot be used ({what}); call "
            "reloadpg_autopatch.reload_process_groups() on every rank first"
        )

    def phase(self, step: DestroyStep | ReloadStep) -> str:
        """The phase of the step's report that carrying out ``step`` counts under."""
        return "destroy" if isinstance(step, DestroyStep) else "creations"

    def note(self, run: DestroyRun | ReloadRun, outcome: str, record: Record) -> None:
        """Name the group under ``outcome`` in the step's report."""
        if isinstance(run, DestroyRun):
            run.destroyed.append(str(record.name))
        else:
            run.names[outcome].append(str(record.name))

    def timed(self, run: ReloadRun, record: Record, milliseconds: float) -> None:
        """What a creation (or a rebuild) of the group took, in the step's report."""
        run.part.creations[str(record.name)] = milliseconds

    def listed(self, record: Record) -> bool:
        """Whether ``reloadable_groups()`` lists it: a group the program holds that a cycle
        frees and brings back, awake or asleep by any way (so that one program sees the same
        list in every mode); not one released while it sleeps, nor a broken one."""
        kept = record.state in (State.LIVE, State.DESTROYED, State.SUSPENDED)
        return record.held is not None and kept and not record.release_pending
