"""Where a test lane's seconds go, from pytest's JUnit XML: the slowest tests and each file's total.

    python -m pytest --junitxml=lane.xml          # once per lane
    python -m benchmarks.ci_time lane.xml [--before before.xml] [--slowest 30]

prints Markdown: the lane's total, its slowest tests, and the seconds per test file (beside the
``--before`` run's, matched by file name, so a file that moved folders still lines up). The
tables in ``benchmarks/results/ci-time.md`` were made with it.
"""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET
from pathlib import Path


def cases(path: Path) -> list[tuple[str, str, float]]:
    """``(file, test, seconds)`` for every test case of a JUnit XML report."""
    out = []
    for case in ET.parse(path).iter("testcase"):  # noqa: S314 - pytest's own report
        module = case.get("classname", "").rsplit(".", 1)[-1]
        out.append((module, case.get("name", ""), float(case.get("time", 0))))
    return out


def per_file(rows: list[tuple[str, str, float]]) -> dict[str, float]:
    totals: dict[str, float] = collections.Counter()
    for module, _, seconds in rows:
        totals[module] += seconds
    return dict(totals)


def report(after: Path, before: Path | None, slowest: int) -> str:
    rows = cases(after)
    lines = [f"total: {sum(r[2] for r in rows):.0f} s over {len(rows)} tests", ""]
    lines += [f"| slowest {slowest} | s |", "| --- | ---: |"]
    for module, name, seconds in sorted(rows, key=lambda r: -r[2])[:slowest]:
        lines.append(f"| `{module}::{name}` | {seconds:.1f} |")
    files = per_file(rows)
    old = per_file(cases(before)) if before else {}
    lines += ["", "| file | s | before |" if old else "| file | s |"]
    lines.append("| --- | ---: | ---: |" if old else "| --- | ---: |")
    for module in sorted(set(files) | set(old), key=lambda m: -max(files.get(m, 0), old.get(m, 0))):
        cells = [f"`{module}`", f"{files.get(module, 0):.1f}"]
        if old:
            cells.append(f"{old.get(module, 0):.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--before", type=Path)
    parser.add_argument("--slowest", type=int, default=30)
    args = parser.parse_args(argv)
    print(report(args.report, args.before, args.slowest))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
