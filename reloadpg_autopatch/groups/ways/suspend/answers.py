"""What a rank says at a destroy about its groups that sleep by suspend: the suspend section.

Carried in the destroy's one round (``agreement.Section``), so nothing is added to the happy
path but this section's bytes, and only on ranks that hold such groups. Every member says
whether its communicator can suspend (``memory_stats()``, local), exists yet, would free enough
(``auto`` mode), and whether this rank let the group go; ``verdicts`` turns the merged answers
into one verdict per group, the same on every rank (``verdicts.sleep_verdict``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import ClassVar

from ...agreement import LINES, NAMES, Section, section
from .verdicts import Reports, Verdict, sleep_verdict


@section
@dataclasses.dataclass
class SuspendAnswers(Section):
    """This rank's answers about the groups that sleep by suspend."""

    NAME: ClassVar[str] = "suspend"

    #: Its communicator answered ``memory_stats()``: it can suspend.
    ok: list[str] = field(default_factory=list, metadata=NAMES)
    #: It can suspend, but no communicator exists yet (NCCL initializes lazily).
    uninitialized: list[str] = field(default_factory=list, metadata=NAMES)
    #: Some backend of it cannot suspend here.
    unsupported: list[str] = field(default_factory=list, metadata=NAMES)
    #: This rank let it go (dropped, or released while awake): no peer may enter its barrier.
    released: list[str] = field(default_factory=list, metadata=NAMES)
    #: Groups this rank left awake at creation that torch still knows (``left_awake``).
    awake: list[str] = field(default_factory=list, metadata=NAMES)
    #: Why, per group, a backend cannot suspend here.
    why: list[str] = field(default_factory=list, metadata=LINES)
    #: ``auto`` mode: a suspend would free less than ``SLIME_RELOADABLE_PG_SUSPEND_MIN_FREED``
    #: of its memory here; what it would free (one line per group and figure, no rank in it);
    #: and the groups this rank could not free instead (torch's own, not rebuilt in place).
    little: list[str] = field(default_factory=list, metadata=NAMES)
    little_why: list[str] = field(default_factory=list, metadata=LINES)
    cannot_free: list[str] = field(default_factory=list, metadata=NAMES)

    def verdicts(self) -> dict[str, Verdict]:
        """Each asked group's verdict, from every member's answer: the same on every rank.

        A group some member left awake (its backends there serve the CPU or cannot suspend)
        stays awake on every member: nobody suspends it, and nobody destroys it either (that
        member would never take part in creating it again). A group every member left awake
        is not the agreement's business.
        """
        every = {*self.ok, *self.uninitialized, *self.unsupported, *self.released}
        released = set(self.released) | (set(self.awake) & every)
        asked = (
            set(self.ok),
            set(self.uninitialized),
            set(self.unsupported),
            released,
            set(self.little),
            set(self.cannot_free),
        )
        return {name: sleep_verdict(Reports(*(name in s for s in asked))) for name in every}
