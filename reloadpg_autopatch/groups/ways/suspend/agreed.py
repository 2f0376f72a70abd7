"""What every rank agreed about the groups that sleep by suspend, for the length of one step.

The destroy's agreement carries the suspend section (``answers``); once merged, the verdicts
are read once and kept in the step's scratch, with the watchdog's timeout (read once a step);
``suspend`` mode refuses here, alike on every rank and before anything sleeps, a group some
member cannot suspend; and a group freed instead of suspended is named in the report with the
share a suspend would have freed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...._env import MODE_ENV
from ....errors import ModeRefusedError
from ... import mode
from ...record import Record
from ...runs import DestroyRun, ReloadRun
from ...store import channel
from ...watchdog import suspend_timeout
from .answers import SuspendAnswers
from .verdicts import Verdict

#: This way's slot in a step's scratch.
SLOT = "suspend"


@dataclass
class Agreed:
    """One step's view of the suspend section: the verdicts, and the watchdog's timeout."""

    answers: SuspendAnswers = field(default_factory=SuspendAnswers)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    seconds: float | None = None


def of(run: DestroyRun | ReloadRun) -> Agreed:
    """This step's suspend view (made on first use)."""
    found = run.scratch.get(SLOT)
    if found is None:
        found = run.scratch[SLOT] = Agreed()
    return found


def suspend_seconds(run: DestroyRun | ReloadRun) -> float:
    """How long one suspend or resume may take in this step (read once a step)."""
    agreed = of(run)
    if agreed.seconds is None:
        agreed.seconds = suspend_timeout(channel.world_timeout())
    return agreed.seconds


def read_agreed(run: DestroyRun) -> None:
    """Every rank's suspend answers merged: each group's verdict; in ``suspend`` mode, the
    refusal of a group some member cannot suspend (or left awake)."""
    if run.agreed is None:
        return
    agreed = of(run)
    agreed.answers = run.agreed.section(SuspendAnswers)
    agreed.verdicts = agreed.answers.verdicts()
    if mode.get_reload_mode() == "suspend":
        _refuse_what_cannot_suspend(agreed)


def _refuse_what_cannot_suspend(agreed: Agreed) -> None:
    answers = agreed.answers
    awake = set(answers.awake)
    refused = sorted(n for n, v in agreed.verdicts.items() if v is Verdict.FALLBACK or n in awake)
    if not refused:
        return
    named = tuple(f"group {name!r}:" for name in refused)
    reasons = {why for why in answers.why if why.startswith(named)} | {
        f"group {name!r}: its members answered differently (it can suspend on some; on "
        "others its backends serve only the CPU or do not support suspend, so it was left "
        "awake)"
        for name in refused
        if name in awake
    }
    why = "; ".join(sorted(reasons)) or (
        "its members' communicators answered differently (initialized on some, not yet on others)"
    )
    raise ModeRefusedError(
        f"destroy_process_groups() ({channel.where('destroy')}): {MODE_ENV}=suspend, "
        f"but groups {', '.join(map(repr, refused))} cannot be suspended on every member: "
        f"{why}. Nothing was suspended or destroyed on any rank; use mode 'auto' to reload "
        "such groups another way"
    )


def verdict_of(record: Record, run: DestroyRun) -> Any:
    """The verdict every rank agreed for ``record`` (None: not asked, made while asleep)."""
    return of(run).verdicts.get(str(record.name))


def note_freed_instead(record: Record, run: DestroyRun) -> None:
    """Name a group freed instead of suspended, and why, in the destroy's report."""
    name = str(record.name)
    agreed = of(run)
    if agreed.verdicts.get(name) is not Verdict.FREE:
        return
    why = "; ".join(
        line.partition(": ")[2]
        for line in sorted(agreed.answers.little_why)
        if line.partition(": ")[0] == name
    )
    run.part.groups.setdefault("freed, not suspended", []).append(f"{name} ({why})")
