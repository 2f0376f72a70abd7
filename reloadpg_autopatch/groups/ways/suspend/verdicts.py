"""What the ranks agreed a group that sleeps by suspend does at a destroy: one verdict each.

Every member answers at the destroy's agreement (``answers``) whether its communicator can
suspend, exists yet, frees enough, and whether this rank let the group go; ``sleep_verdict``
turns every member's answers about one group into the one verdict every rank then acts on, a
pure function tested over every combination of its inputs (``tests/unit/test_decisions.py``).
"""

from __future__ import annotations

import enum
from typing import NamedTuple


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
