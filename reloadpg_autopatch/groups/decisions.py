"""What destroy and reload do with each record: pure functions from facts to one step.

The facts are what a rank knows about a record (its state, its way, whether the program still
holds it) and, for a reload, what every rank agreed on through the store (who still holds the
group, who reloads it in place, who released it). ``destroy_step`` and ``reload_step`` ask the
record's way (``ways.base.Way``), which looks at nothing else, so each can be tested over every
combination of its inputs in one process; ``destroy`` and ``reload`` have each step carried out
by the record's way, calling the method of the step. This module holds the vocabulary every way
shares: the facts and the steps (a way's own verdicts are its own: ``ways.suspend.verdicts``).
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

from .record import State


class DestroyFacts(NamedTuple):
    """What ``destroy_process_groups()`` knows about one record on this rank."""

    state: State
    #: The record's way (``ways.base.Way``).
    way: Any
    #: The program dropped the wrapper (only a wrapper can be dropped: torch holds in-place
    #: groups in its maps).
    abandoned: bool
    #: What the ranks agreed about it in its way's own section of the destroy's agreement (a
    #: suspend's: ``ways.suspend.verdicts.Verdict``); None where its way asks nothing there,
    #: or for a group made while asleep, when nobody was asked.
    verdict: Any = None
    #: Its members would take different ways: the step of the common way the ranks agreed on
    #: (``FREE_WRAPPED`` or ``KEEP_RESIDENT``: ``ways.common``), else None.
    shared: DestroyStep | None = None


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
    """The step for one record, from its facts (and what its way's section agreed) alone."""
    return facts.way.destroy_step(facts)


class ReloadFacts(NamedTuple):
    """What ``reload_process_groups()`` knows about one record, and what the ranks agreed."""

    state: State
    #: The record's way (``ways.base.Way``).
    way: Any
    #: The program released it while it slept suspended (``destroy_process_group(g)``).
    release_pending: bool
    #: Some rank still holds the group (the union of every rank's held groups).
    needed: bool
    #: Its members create nothing for it (reconfigured in place, resumed, or kept awake), so
    #: its non-members, and a member that released a group that sleeps by suspend, neither.
    peers_in_place: bool
    #: A member released it although it reloads in place (it cannot be rebuilt).
    released_by_a_member: bool
    #: Every group torch knew was torn down by this reload before this record's turn (WORLD's
    #: restore: ``world``), so a group made while asleep has no communicator any more.
    torn_down: bool


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
    return facts.way.reload_step(facts)
