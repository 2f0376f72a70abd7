"""Medians, spreads and verdicts shared by every figure."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Summary:
    """A sample's median and interquartile range, in the unit it was measured in."""

    median: float
    p25: float
    p75: float
    n: int

    @property
    def iqr(self) -> float:
        return self.p75 - self.p25

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "p25": self.p25, "p75": self.p75, "n": self.n}


def percentile(samples: Sequence[float], q: int) -> float:
    """The ``q``-th percentile (1..99) of ``samples``."""
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


def summarize(samples: Sequence[float]) -> Summary:
    ordered = sorted(samples)
    if len(ordered) == 1:
        return Summary(ordered[0], ordered[0], ordered[0], 1)
    q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    return Summary(statistics.median(ordered), q1, q3, len(ordered))


@dataclass
class Row:
    """One line of the table: what was measured, the value, the target, and the verdict."""

    figure: str
    case: str
    value: str
    target: str
    ok: bool | None  # None: informational, no target

    @property
    def verdict(self) -> str:
        return "-" if self.ok is None else ("MET" if self.ok else "MISSED")


def table(rows: Sequence[Row]) -> str:
    headers = ("figure", "case", "measured (median [IQR])", "target", "verdict")
    cells = [headers] + [(r.figure, r.case, r.value, r.target, r.verdict) for r in rows]
    widths = [max(len(str(row[i])) for row in cells) for i in range(len(headers))]
    lines = []
    for index, row in enumerate(cells):
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_meta(**extra: object) -> dict[str, object]:
    """What every results file says of the run that made it: the date, torch, Python and the
    machine, then ``extra``."""
    import datetime
    import os
    import platform

    import torch

    return {
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        **extra,
    }
