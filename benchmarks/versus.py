"""This tree against an earlier commit, side by side in one run: start-up and the hot path.

``python -m benchmarks.versus [REF] [--rounds N]`` checks REF out beside this tree (a detached
git worktree in a temporary folder) and measures both, alternating, in the same venv: the
package each tree holds comes first on ``PYTHONPATH``, and the venv's ``.pth`` (the same line
in both trees) activates whichever it finds. Alternating rounds put drift on a shared machine
on both sides alike; the table gives each side's median and their difference.

- interpreter start, gate off and gate on (no torch imported);
- ``import torch.distributed`` with the gate on (the patch included);
- per call, from each tree's own ``benchmarks.overhead``: ``get_world_size`` through a native
  and a reloadable group.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.stats import Row, summarize, table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

IMPORT = (
    "import time; s = time.perf_counter(); import torch.distributed; "
    "print((time.perf_counter() - s) * 1e3)"
)


def _env(tree: Path, gate: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLIME_RELOADABLE_PG")}
    env["PYTHONPATH"] = str(tree)
    env["SLIME_RELOADABLE_PG"] = gate
    return env


def _start_ms(tree: Path, gate: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=_env(tree, gate), check=True)
    return (time.perf_counter() - started) * 1e3


def _import_ms(tree: Path) -> float:
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", IMPORT],
        env=_env(tree, "1"),
        check=True,
        capture_output=True,
        text=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def _per_call(tree: Path, rounds: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "benchmarks.overhead", str(rounds)],
        cwd=str(tree),
        env=_env(tree, "0"),
        check=True,
        capture_output=True,
        text=True,
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])["get_world_size"]
    return {
        group: data[f"ours, {group} group"]["overhead_ns"]["estimate"]
        for group in ("native", "reloadable")
    }


def measure(old: Path, new: Path, rounds: int) -> dict[str, Any]:
    trees = {"before": old, "after": new}
    samples: dict[str, dict[str, list[float]]] = {side: {} for side in trees}

    def add(side: str, what: str, value: float) -> None:
        samples[side].setdefault(what, []).append(value)

    for index in range(rounds):
        order = list(trees) if index % 2 == 0 else list(reversed(trees))
        for side in order:
            tree = trees[side]
            for _ in range(10):
                add(side, "start, gate off (ms)", _start_ms(tree, "0"))
                add(side, "start, gate on, no torch (ms)", _start_ms(tree, "1"))
            for _ in range(3):
                add(side, "import torch.distributed, gate on (ms)", _import_ms(tree))
            calls = _per_call(tree, 15)
            for group, ns in calls.items():
                add(side, f"get_world_size overhead, {group} group (ns)", ns)
    return {
        side: {what: summarize(values).as_dict() for what, values in found.items()}
        for side, found in samples.items()
    }


def rows(result: dict[str, Any], ref: str) -> list[Row]:
    out = []
    for what, before in result["before"].items():
        after = result["after"][what]
        delta = after["median"] - before["median"]
        out.append(
            Row(
                "versus",
                what,
                f"after {after['median']:.2f} [{after['p25']:.2f}-{after['p75']:.2f}] vs before "
                f"({ref}) {before['median']:.2f} [{before['p25']:.2f}-{before['p75']:.2f}]: "
                f"{delta:+.2f}",
                "no regression beyond noise (the bands overlap)",
                after["p25"] <= before["p75"],
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.versus", description=__doc__)
    parser.add_argument("ref", nargs="?", default="HEAD~1")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    ref = (
        subprocess.run(
            ["git", "rev-parse", "--short", args.ref], cwd=ROOT, check=True, capture_output=True
        )
        .stdout.decode()
        .strip()
    )
    with tempfile.TemporaryDirectory() as where:
        old = Path(where) / "before"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "--quiet", str(old), ref], cwd=ROOT, check=True
        )
        try:
            result = measure(old, ROOT, args.rounds)
        finally:
            remove = ["git", "worktree", "remove", "--force", str(old)]
            subprocess.run(remove, cwd=ROOT, check=False)
    found = rows(result, ref)
    print(table(found))
    if not args.no_save:
        import torch

        today = datetime.date.today().isoformat()
        target = RESULTS / f"{today}-{torch.__version__}-versus-{ref}.json"
        RESULTS.mkdir(exist_ok=True)
        table_rows = [r.__dict__ | {"verdict": r.verdict} for r in found]
        target.write_text(json.dumps({"ref": ref, "table": table_rows, "raw": result}, indent=2))
        print(f"wrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
