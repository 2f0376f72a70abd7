"""What destroy and reload do with each record: pure functions from facts to one step.

The facts are what a rank knows about a record (its state, how it sleeps, whether the program
still holds it) and, for a reload, what every rank agreed on through the store (who still
holds the group, who reloads it in place, who released it). ``destroy_step`` and
``reload_step`` look at nothing else, so they can be tested over every combination of their
inputs in one process; ``destroy`` and ``reload`` execute each step through a table.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from .record import State, Way


class Sleep(enum.Enum):
    """What the ranks agreed a suspend-mode group does at this destroy."""

    #: Every member's communicator answered: suspend it, and guard the group.
    SUSPEND = "suspend"
    #: No member's communicator exists yet (NCCL initializes lazily): nothing to free, but
    #: the group is guarded so that nothing initializes it while asleep.
    GUARD = "guard"
    #: Some member cannot suspend it, or their answers differ: destroyed behind its wrapper,
    #: or left resident when the program holds torch's own object.
    FALLBACK = "fallback"
    #: A member released it: it stays as it is on every other member (a suspend would wait
    #: in NCCL's barrier for the member that let go).
    RESIDENT = "resident"


class Reports(NamedTuple):
    """Whether some member reported each answer about one group at the destroy's agreement."""

    ok: bool
    uninitialized: bool
    unsupported: bool
    released: bool


def sleep_verdict(reports: Reports) -> Sleep:
    """One group's verdict from every member's answer: the same on every rank."""
    if reports.released:
        return Sleep.RESIDENT
    if reports.unsupported or (reports.ok and reports.uninitialized):
        return Sleep.FALLBACK
    if reports.uninitialized:
        return Sleep.GUARD
    if reports.ok:
        return Sleep.SUSPEND
    return Sleep.FALLBACK  # nobody answered: a group no member holds any more


class DestroyFacts(NamedTuple):
    """What ``destroy_process_groups()`` knows about one record on this rank."""

    state: State
    way: Way
    #: The program dropped the wrapper (only a wrapper can be dropped: torch holds in-place
    #: groups in its maps).
    abandoned: bool
    #: For a group that sleeps by suspend: what the ranks agreed (None: another way).
    verdict: Sleep | None = None


class DestroyStep(enum.Enum):
    """What a destroy does with one record."""

    #: Nothing to free: destroyed already, a non-member, released or ended.
    NOTHING = "nothing"
    #: The program dropped it: free it if live, and release it for good.
    RELEASE_ABANDONED = "release abandoned"
    #: Destroy the native group behind the wrapper.
    FREE_WRAPPED = "free wrapped"
    #: Shut the communicator down inside torch's own object (native mode).
    FREE_IN_PLACE = "free in place"
    #: Guard the group, then suspend its communicator (suspend mode).
    SUSPEND = "suspend"
    #: Guard the group; nothing to suspend (no communicator yet).
    GUARD = "guard"
    #: Leave it awake and resident, and say so in the report.
    KEEP_RESIDENT = "keep resident"


def destroy_step(facts: DestroyFacts) -> DestroyStep:
    """The step for one record, from its facts (and, in suspend mode, the verdict) alone."""
    abandoned = facts.abandoned and not facts.way.torch_object
    if abandoned and facts.state in (State.LIVE, State.DESTROYED):
        return DestroyStep.RELEASE_ABANDONED
    if facts.state is not State.LIVE:
        return DestroyStep.NOTHING
    if facts.way.suspends:
        verdict = facts.verdict if facts.verdict is not None else Sleep.FALLBACK
        if verdict is Sleep.SUSPEND:
            return DestroyStep.SUSPEND
        if verdict is Sleep.GUARD:
            return DestroyStep.GUARD
        if verdict is Sleep.FALLBACK and facts.way is Way.SUSPEND_WRAPPED:
            return DestroyStep.FREE_WRAPPED
        return DestroyStep.KEEP_RESIDENT
    if facts.way is Way.IN_PLACE:
        return DestroyStep.FREE_IN_PLACE
    return DestroyStep.FREE_WRAPPED


class ReloadFacts(NamedTuple):
    """What ``reload_process_groups()`` knows about one record, and what the ranks agreed."""

    state: State
    way: Way
    #: The program released it while it slept suspended (``destroy_process_group(g)``).
    release_pending: bool
    #: Some rank still holds the group (the union of every rank's held groups).
    needed: bool
    #: Its members create nothing for it (reconfigured in place, resumed, or kept awake), so
    #: its non-members, and a member that released a group that sleeps by suspend, neither.
    peers_in_place: bool
    #: A member released it although it reloads in place (it cannot be rebuilt).
    released_by_a_member: bool
    #: WORLD was restored by this reload, which tore down every group torch knew.
    world_restored: bool


class ReloadStep(enum.Enum):
    """What a reload does with one record."""

    #: Nothing: awake already (made while asleep), or ended.
    NOTHING = "nothing"
    #: Nobody holds it any more: it ends on every rank at once.
    FORGET = "forget"
    #: Create a native group again under its name, serve the wrapper with it.
    RECREATE = "recreate"
    #: Its group was made while asleep and torn down by WORLD's restore: recreate it.
    RECREATE_AFTER_RESTORE = "recreate after restore"
    #: Reconfigure torch's own object in place (native mode).
    REBUILD_IN_PLACE = "rebuild in place"
    #: Not ours (released, or not a member) but a peer needs it: take part in the creation.
    TAKE_PART = "take part"
    #: Its members reconfigure it by themselves: a non-member has nothing to do.
    LEAVE_TO_MEMBERS = "leave to members"
    #: In place, but released by a member: it cannot be rebuilt.
    REFUSE_RELEASED_BY_A_MEMBER = "refuse: released by a member"
    #: In place, released here, but a peer still holds it: it cannot be rebuilt.
    REFUSE_RELEASED_HERE = "refuse: released here"
    #: In place, but WORLD's restore tore its communicator down: nothing can rebuild it.
    REFUSE_TORN_DOWN = "refuse: torn down by WORLD"
    #: Suspended (or only guarded): resume it and lift the guard.
    RESUME = "resume"
    #: Suspended, and released by the program while it slept: resume it with its peers (the
    #: resume is collective), then free it here.
    RESUME_THEN_RELEASE = "resume, then release"


def reload_step(facts: ReloadFacts) -> ReloadStep:
    """The step for one record, from its facts and the agreement alone."""
    state, in_place = facts.state, facts.way is Way.IN_PLACE
    if state in (State.ENDED, State.BROKEN):
        return ReloadStep.NOTHING
    if state is State.SUSPENDED:
        return ReloadStep.RESUME_THEN_RELEASE if facts.release_pending else ReloadStep.RESUME
    if state in (State.RELEASED, State.NON_MEMBER):
        if not facts.needed:
            return ReloadStep.FORGET
        if in_place:  # only a member reloads in place: it released the group here
            return ReloadStep.REFUSE_RELEASED_HERE
        if facts.peers_in_place and (state is State.NON_MEMBER or facts.way.suspends):
            return ReloadStep.LEAVE_TO_MEMBERS
        return ReloadStep.TAKE_PART
    if state is State.LIVE:
        if not facts.world_restored:
            return ReloadStep.NOTHING
        return ReloadStep.REFUSE_TORN_DOWN if in_place else ReloadStep.RECREATE_AFTER_RESTORE
    # DESTROYED
    if in_place:
        if facts.world_restored:
            return ReloadStep.REFUSE_TORN_DOWN
        if facts.released_by_a_member:
            return ReloadStep.REFUSE_RELEASED_BY_A_MEMBER
        return ReloadStep.REBUILD_IN_PLACE
    return ReloadStep.RECREATE
