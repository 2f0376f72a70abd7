"""The store's key count over 1,000 cycles of 20 groups, 2 gloo ranks, wrapper mode.

Every cycle creates the groups again (wrapper mode, the default); torch writes their creation
keys and never deletes them, so without the package's sweep the store host grows by two keys per
group per cycle (40,000 after 1,000 cycles). Rank 0 counts the server's keys through a client of
its own (``num_keys()``) after the first cycle and after the last.

``python -m benchmarks.store_keys [--quick]`` runs it alone (and writes
``results/<date>-<torch>-store-keys.json``); ``python -m benchmarks`` includes its row.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from benchmarks import stats
from benchmarks.stats import Row
from reloadpg_autopatch.tools import launch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
GROUPS = 20


def _rank(argv: list[str]) -> int:
    parser = launch.rank_parser("one rank of the store-keys benchmark")
    parser.add_argument("--cycles", type=int, required=True)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    import reloadpg_autopatch as rpg

    rpg.monkey_patch_torch_dist()
    launch.init_rank(args, timeout=120)
    import torch.distributed as dist

    groups = [dist.new_group(list(range(args.world_size))) for _ in range(GROUPS)]
    oracle = dist.TCPStore(args.host, args.port, args.world_size, is_master=False)
    counts = {}
    for cycle in range(1, args.cycles + 1):
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        if cycle in (1, args.cycles):
            dist.barrier()
            counts[cycle] = oracle.num_keys()
            dist.barrier()
    assert len(groups) == GROUPS
    launch.emit({"type": "keys", "rank": args.rank, "counts": counts})
    return 0


def run(quick: bool = False) -> tuple[list[Row], dict[str, Any]]:
    cycles = 100 if quick else 1000
    command = [sys.executable, "-m", "benchmarks.store_keys", "--cycles", str(cycles)]
    outcomes = launch.launch(command, 2, timeout=1800, cwd=str(ROOT), env=dict(os.environ))
    counts = next(e["counts"] for o in outcomes for e in o.events if e["type"] == "keys")
    first, last = counts["1"], counts[str(cycles)]
    raw = {"cycles": cycles, "groups": GROUPS, "ranks": 2, "after_first": first, "after_last": last}
    rows = [
        Row(
            "store",
            f"keys on the store after {cycles:,} cycles of {GROUPS} groups (2 ranks, wrapper)",
            f"{last} (after the first cycle: {first})",
            "as after the first cycle",
            last == first,
        )
    ]
    return rows, raw


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--rank" in argv:
        return _rank(argv)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="100 cycles instead of 1,000")
    args = parser.parse_args(argv)
    import torch

    rows, raw = run(quick=args.quick)
    for row in rows:
        print(f"{row.case}: {row.value} (target: {row.target}, {row.verdict})")
    today = datetime.date.today().isoformat()
    meta = stats.run_meta(quick=args.quick)
    table_rows = [r.__dict__ | {"verdict": r.verdict} for r in rows]
    target = RESULTS / f"{today}-{torch.__version__}-store-keys.json"
    target.write_text(json.dumps({"meta": meta, "table": table_rows, "raw": raw}, indent=2) + "\n")
    print(f"wrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
