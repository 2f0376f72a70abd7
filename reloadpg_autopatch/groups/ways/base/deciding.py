"""Which step a destroy or a reload takes with a record: pure, from its facts alone.

``destroy_step`` and ``reload_step`` hold the rules every way shares; a way fills in what is its
own: a live group at a destroy (``sleep_step``), a group a destroy freed (``wake_step``), one a
peer still holds (``elsewhere_step``), one made while asleep (``made_while_asleep_step``). Each
looks at its ``facts`` and at nothing else (``tests/unit/test_decisions.py`` checks the sources).
"""

from __future__ import annotations

from typing import Any

from ...decisions import DestroyFacts, DestroyStep, ReloadFacts, ReloadStep
from ...record import State


class Deciding:
    """The decisions of a destroy and a reload about one record."""

    torch_object: bool
    suspends: bool

    def verdicts(self) -> tuple[Any, ...]:
        """Every verdict of its own the destroy's agreement may give it (``DestroyFacts``'
        ``verdict``): None for a way that answers nothing there."""
        return (None,)

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
            if not self.suspends:
                return ReloadStep.NOTHING  # never suspended by this way: nothing to resume
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
        if facts.torn_down:
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
        """A live group at a reload: made while asleep, and perhaps torn down since
        (then made again behind its wrapper; torch's own object cannot be)."""
        if not facts.torn_down:
            return ReloadStep.NOTHING
        return (
            ReloadStep.REFUSE_TORN_DOWN if self.torch_object else ReloadStep.RECREATE_AFTER_RESTORE
        )
