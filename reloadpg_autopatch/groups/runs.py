"""What one destroy or one reload carries from record to record while it runs.

A driver (``destroy``, ``reload``) hands one of these to each record's way with the step to
carry out; the way reports into it what it did (the names per outcome, the groups for the
hooks, the failures to raise once the step is done), and the driver turns it into the cycle
report and the step's result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import GroupBrokenError
from .agreement import DestroyAnswers, ReloadAnswers
from .report import StepReport
from .store import channel


@dataclass
class DestroyRun:
    """One destroy on this rank."""

    part: StepReport = field(default_factory=StepReport)
    #: Whether this destroy begins the cycle (one while asleep frees only what was made since).
    first: bool = True
    #: What the ranks agreed (None: a destroy while asleep asks nobody).
    agreed: DestroyAnswers | None = None
    #: The common way of each group whose members would take different ways
    #: (``ways.common``).
    shared: dict[str, str] = field(default_factory=dict)
    #: Names of the groups whose communicator was freed, in the order they were.
    destroyed: list[str] = field(default_factory=list)
    #: Groups whose suspend raised: ``(name, error)``.
    failures: list[tuple[str, BaseException]] = field(default_factory=list)
    #: The error of a free that outlived its deadline (``frees``): the frees after it abort.
    stuck: BaseException | None = None
    #: What borrowed a communicator, released before anything was freed (``releases``).
    releases: list[Any] = field(default_factory=list)
    #: What each way keeps for the length of this step, by its name (suspend's verdicts and
    #: watchdog timeout: ``ways.suspend``).
    scratch: dict[str, Any] = field(default_factory=dict)


@dataclass
class ReloadRun:
    """One reload on this rank."""

    part: StepReport = field(default_factory=StepReport)
    agreed: ReloadAnswers = field(default_factory=ReloadAnswers)
    #: Whether this reload tore down every group torch knew (WORLD's restore: ``world``).
    torn_down: bool = False
    #: The groups rebuilt or resumed, in order, for the after-reload hooks.
    rebuilt: list[Any] = field(default_factory=list)
    #: Native groups created only to take part, freed once every rank has created them.
    taken_part: list[Any] = field(default_factory=list)
    #: Group names per outcome, for the report.
    names: dict[str, list[str]] = field(
        default_factory=lambda: {"rebuilt": [], "forgotten": [], "taken_part": [], "resumed": []}
    )
    #: Suspended groups whose resume raised.
    failures: list[tuple[str, BaseException]] = field(default_factory=list)
    #: What each way keeps for the length of this step, by its name.
    scratch: dict[str, Any] = field(default_factory=dict)


def broken(failures: list[tuple[str, BaseException]], action: str, step: str) -> GroupBrokenError:
    """One error for the groups whose ``action`` (suspend, resume) raised during ``step``."""
    text = "; ".join(f"group {name!r}: {type(e).__name__}: {e}" for name, e in failures)
    call = "destroy_process_groups()" if step == "destroy" else "reload_process_groups()"
    error = GroupBrokenError(
        f"{call} ({channel.where(step)}) could not {action} {text}. Such a communicator "
        "is in an unknown state (NCCL may have released part of it): it stays refused, and "
        "this process must restart to use it again; every other group went on as usual"
    )
    error.__cause__ = failures[0][1]
    return error
