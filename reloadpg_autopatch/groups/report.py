"""The cycle report: what one destroy and its reload did, and what memory they gave back.

Freeing accelerator memory is the reason the cycle exists, so the report says how much the
destroy returned (free memory before and after it, and after the reload) beside the time of
each step (the store syncs, the agreement, WORLD's swap, each creation, the hooks) and the
groups rebuilt, forgotten and taken part in.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from . import memory

logger = logging.getLogger("reloadpg_autopatch")


@dataclass
class StepReport:
    """One destroy or one reload on this rank."""

    total_ms: float = 0.0
    #: Milliseconds per phase, in the order they ran.
    phases: dict[str, float] = field(default_factory=dict)
    #: Milliseconds per group created (reload only), by group name.
    creations: dict[str, float] = field(default_factory=dict)
    #: Group names per outcome: ``destroyed``; or ``rebuilt``, ``forgotten``, ``taken_part``.
    groups: dict[str, list[str]] = field(default_factory=dict)
    #: What borrowed a communicator, released before the destroy freed any (destroy only):
    #: ``{"name", "stage", "ms", "error"}`` per release, in the order they ran.
    releases: list[dict[str, Any]] = field(default_factory=list)
    #: The groups a destroy left as they were because this package did not make them
    #: reloadable: ``{name: {ranks, backend, why, memory}}`` (``world.carry.describe``).
    left_alone: dict[str, dict[str, Any]] = field(default_factory=dict)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block and add it to phase ``name``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            spent = (time.perf_counter() - started) * 1e3
            self.phases[name] = self.phases.get(name, 0.0) + spent

    def to_dict(self) -> dict[str, Any]:
        return {
            "total_ms": round(self.total_ms, 3),
            "phases": {k: round(v, 3) for k, v in self.phases.items()},
            "creations": {k: round(v, 3) for k, v in self.creations.items()},
            "groups": {k: list(v) for k, v in self.groups.items()},
            "releases": [dict(r) for r in self.releases],
            "left_alone": {k: dict(v) for k, v in self.left_alone.items()},
        }


MEMORY_POINTS = ("before_destroy", "after_destroy", "after_reload")


@dataclass
class CycleReport:
    """One destroy/reload cycle of this rank: ``destroy`` and ``reload`` once each has run."""

    cycle: int
    world: int
    destroy: StepReport | None = None
    reload: StepReport | None = None
    #: Free accelerator memory around the cycle (None where there is no device or query).
    memory: dict[str, memory.MemoryFigures | None] = field(
        default_factory=lambda: dict.fromkeys(MEMORY_POINTS)
    )
    device: str | None = None
    #: Per group that slept by suspend: its legs, ``memory_stats()`` before the suspend,
    #: asleep and after the resume, and the milliseconds of each call.
    sleep: dict[str, dict[str, Any]] = field(default_factory=dict)

    def measure(self, point: str) -> None:
        device = memory.primary_device()
        self.device = str(device) if device is not None else None
        self.memory[point] = memory.figures(device)

    @property
    def freed_bytes(self) -> int | None:
        """What the destroy gave back: free memory after it minus before it."""
        before, after = self.memory["before_destroy"], self.memory["after_destroy"]
        return None if before is None or after is None else after.free - before.free

    @property
    def nccl(self) -> dict[str, Any] | None:
        """Suspend's totals: what NCCL says it released (and holds pinned on the host as its
        backup) and kept resident, beside the driver's own count (``freed_bytes``)."""
        if not self.sleep:
            return None
        suspended = [g for g in self.sleep.values() if g["legs"]]
        released = sum(g["stats_before"].get("suspend", 0) for g in suspended)
        return {
            "groups": {name: dict(g) for name, g in self.sleep.items()},
            "released_bytes": released,
            "resident_bytes": sum(g["stats_before"].get("persist", 0) for g in suspended),
            "pinned_host_bytes_estimate": released,
            "driver_freed_bytes": self.freed_bytes,
            "suspend_ms": round(sum(g["suspend_ms"] for g in suspended), 3),
            "resume_ms": round(sum(g["resume_ms"] for g in suspended), 3),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "cycle": self.cycle,
            "world": self.world,
            "device": self.device,
            "destroy": self.destroy.to_dict() if self.destroy is not None else None,
            "reload": self.reload.to_dict() if self.reload is not None else None,
            "memory": {k: (v.to_dict() if v is not None else None) for k, v in self.memory.items()},
            "freed_bytes": self.freed_bytes,
            "nccl": self.nccl,
        }

    def summary(self, step: str) -> str:
        """One log line for ``step`` ("destroy" or "reload")."""
        return describe(self.to_dict(), steps=(step,))


def describe(report: dict[str, Any], steps: tuple[str, ...] = ("destroy", "reload")) -> str:
    """One line for a report's ``to_dict()`` (the log, the demo and the doctor show it)."""
    parts = []
    for step in steps:
        part = report.get(step)
        if not part:
            continue
        phases = ", ".join(f"{k} {v:.1f}" for k, v in part["phases"].items() if v >= 0.05)
        counts = ", ".join(f"{len(v)} {k.replace('_', ' ')}" for k, v in part["groups"].items())
        left = ", ".join(f"{k} ({v['why']})" for k, v in part.get("left_alone", {}).items())
        counts += f"; left alone: {left}" if left else ""
        parts.append(f"{step} {part['total_ms']:.1f} ms ({phases or 'nothing to time'}; {counts})")
    line = f"cycle {report['cycle']}: " + "; ".join(parts)
    free = [
        f"{point.replace('_', ' ')} {figures['free'] / memory.GiB:.2f} GiB"
        for point, figures in report.get("memory", {}).items()
        if figures is not None
    ]
    if free:
        line += f"; free on {report.get('device')}: " + ", ".join(free)
    nccl = report.get("nccl")
    if nccl:
        line += (
            f"; NCCL released {memory.human(nccl['released_bytes'])}, kept "
            f"{memory.human(nccl['resident_bytes'])} resident"
        )
    return line


def log(report: CycleReport, step: str) -> None:
    """The step's line at INFO, built only where INFO is on (two dicts of every group a step)."""
    if logger.isEnabledFor(logging.INFO):
        logger.info(report.summary(step), extra={"reloadpg_cycle": report.to_dict()})
