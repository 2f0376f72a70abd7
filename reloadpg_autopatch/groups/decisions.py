"""What destroy and reload do with each record: pure functions from facts to one step.

The facts are what a rank knows about a record (its state, its way, whether the program still
holds it) and, for a reload, what every rank agreed on through the store (who still holds the
group, who reloads it in place, who released it). ``destroy_step`` and ``reload_step`` ask the
record's way (``ways.base.Way``), which looks at nothing else, so each can be tested over every
combination of its inputs in one process; ``destroy`` and ``reload`` have each step carried out
by the record's way, through a table. This module holds the vocabulary: the facts, the steps,
and the verdict of the ranks' answers about a group that sleeps by suspend.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

from .record import State


class Verdict(enum.Enum):
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
    #: A suspend would keep most of its memory on some member (``auto`` mode: a one-rank
    #: communicator's network buffer, inter-node buffers), and every member can free it
    #: instead: freed behind its wrapper, or in place, and made again at the reload.
    FREE = "free instead"


class Reports(NamedTuple):
    """Whether some member reported each answer about one group at the destroy's agreement."""

    ok: bool
    uninitialized: bool
    unsupported: bool
    released: bool
    #: A suspend would free little of its memory there (``auto`` mode only).
    little: bool = False
    #: That member cannot free it instead (torch's own object that cannot be rebuilt in place).
    cannot_free: bool = False


def sleep_verdict(reports: Reports) -> Verdict:
    """One group's verdict from every member's answer: the same on every rank."""
    if reports.released:
        return Verdict.RESIDENT
    if reports.unsupported or (reports.ok and reports.uninitialized):
        return Verdict.FALLBACK
    if reports.uninitialized:
        return Verdict.GUARD
    if reports.ok:
        return Verdict.FREE if reports.little and not reports.cannot_free else Verdict.SUSPEND
    return Verdict.FALLBACK  # nobody answered: a group no member holds any more


class DestroyFacts(NamedTuple):
    """What ``destroy_process_groups()`` knows about one record on this rank."""

    state: State
    #: The record's way (``ways.base.Way``).
    way: Any
    #: The program dropped the wrapper (only a wrapper can be dropped: torch holds in-place
    #: groups in its maps).
    abandoned: bool
    #: For a group that sleeps by suspend: what the ranks agreed (None: another way, or made
    #: while asleep, when nobody was asked).
    verdict: Verdict | None = None
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
    """The step for one record, from its facts (and, in suspend mode, the verdict) alone."""
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
    return facts.way.reload_step(facts)
