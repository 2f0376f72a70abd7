"""Memory over a long run: each mode's RSS against a gate-off control doing the same work.

Two real gloo ranks per variant, forked from a warm parent (``tests/support/ranks.py``), each
running ``--cycles`` destroy + reload cycles of the groups of ``benchmarks.whole_run`` (wrapper:
WORLD registered and swapped, a pair and everyone; suspend and auto: the suspendable stand-in,
auto adding a gloo group behind a wrapper). The control runs with the gate off and makes torch
do what a wrapper cycle asks of it: destroy the same groups and create them again. The
stand-in logs every call it serves (``suspendable.CALLS``, for the tests): the log is cleared
after each cycle, since no NCCL keeps one.

Rank 0 reads its RSS (``/proc/self/statm``) after cycles 1, 10, 100, 1,000, ... and the last,
and attributes what grows between the first checkpoint past ``--warm`` cycles and the last: the
Python objects per type (``gc.get_objects()``), and with ``--trace`` the Python allocations per
line (``tracemalloc``: slower, so for short runs). What Python cannot see is C++'s (torch, gloo).

``python -m benchmarks.rss [--cycles N] [--warm N] [--trace] [--variants wrapper,control]``
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks import stats
from benchmarks.stats import Row, table
from tests.support.ranks import GATE, Rank, run_ranks

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
VARIANTS = ("wrapper", "suspend", "auto", "control")
#: Growth per cycle past the warm-up that is the package's, at most (beyond the control's).
TARGET_BYTES = 1024


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _types() -> Counter[str]:
    import gc

    gc.collect()
    return Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())


def _checkpoints(cycles: int) -> list[int]:
    points, n = [], 1
    while n < cycles:
        points.append(n)
        n *= 10
    return [*points, cycles]


def _run(ctx: Rank) -> dict[str, Any]:
    import tracemalloc

    import torch.distributed as dist

    from benchmarks.whole_run import _start

    variant = os.environ["RSS_VARIANT"]
    cycles, warm = int(os.environ["RSS_CYCLES"]), int(os.environ["RSS_WARM"])
    trace = os.environ.get("RSS_TRACE") == "1"
    if variant == "control":
        from datetime import timedelta

        client = dist.TCPStore(ctx.host, ctx.port, ctx.world_size, is_master=False)
        dist.init_process_group(
            "gloo", store=client, rank=ctx.rank, world_size=ctx.world_size, timeout=timedelta(60)
        )
        ranks = list(range(ctx.world_size))
        groups = [dist.new_group(ranks[:2]), dist.new_group(ranks)]

        def cycle() -> None:
            for group in reversed(groups):
                dist.destroy_process_group(group)
            groups[:] = [dist.new_group(ranks[:2]), dist.new_group(ranks)]

    else:
        from reloadpg_autopatch.tools import cpu_nccl as suspendable

        _dist, rpg, _groups = _start(ctx, variant)

        def cycle() -> None:
            rpg.destroy_process_groups()
            rpg.reload_process_groups()
            suspendable.CALLS.clear()  # the stand-in's log of every call it served: its own

    rss: dict[int, int] = {0: _rss()}
    points = set(_checkpoints(cycles))
    first = min((p for p in points if p >= warm), default=cycles)
    types_at: Counter[str] = Counter()
    snapshot = None
    for n in range(1, cycles + 1):
        cycle()
        if n in points:
            dist.barrier()
            rss[n] = _rss()
            if n == first:
                types_at = _types()
                if trace:
                    tracemalloc.start(8)
                    snapshot = tracemalloc.take_snapshot()
    grown = _types()
    grown.subtract(types_at)
    out: dict[str, Any] = {
        "rss": rss,
        "from": first,
        "objects": [(name, n) for name, n in grown.most_common(12) if n > 0],
    }
    if snapshot is not None:
        diff = tracemalloc.take_snapshot().compare_to(snapshot, "lineno")
        out["traced"] = [(str(s.traceback), s.size_diff, s.count_diff) for s in diff[:12]]
        tracemalloc.stop()
    dist.barrier()
    return out


def run(cycles: int, warm: int, trace: bool, variants: tuple[str, ...]) -> dict[str, Any]:
    raw: dict[str, Any] = {"cycles": cycles, "warm": warm}
    for variant in variants:
        env = {
            **(GATE if variant != "control" else {"SLIME_RELOADABLE_PG": "0"}),
            "SLIME_RELOADABLE_PG_MODE": "wrapper" if variant == "control" else variant,
            "RSS_VARIANT": variant,
            "RSS_CYCLES": str(cycles),
            "RSS_WARM": str(warm),
            "RSS_TRACE": "1" if trace else "0",
        }
        raw[variant] = run_ranks(_run, 2, timeout=4 * 3600, env=env)[0]
    return raw


def rows_of(raw: dict[str, Any]) -> list[Row]:
    rows = []
    control = raw.get("control")

    def per_cycle(result: dict[str, Any]) -> float:
        rss = {int(k): v for k, v in result["rss"].items()}
        last, first = max(rss), int(result["from"])
        return (rss[last] - rss[first]) / max(last - first, 1)

    base = per_cycle(control) if control is not None else None
    for variant in VARIANTS:
        result = raw.get(variant)
        if result is None:
            continue
        rss = {int(k): v for k, v in result["rss"].items()}
        growth = per_cycle(result)
        ours = None if base is None or variant == "control" else growth - base
        label = "control (gate off, torch re-creating the groups)" if ours is None else variant
        rows.append(
            Row(
                "memory",
                f"RSS, {label}: before, after cycle 1, after {max(rss):,}",
                f"{rss[0] / 1e6:.1f}, {rss.get(1, 0) / 1e6:.1f}, {rss[max(rss)] / 1e6:.1f} MB; "
                f"{growth:+.0f} B a cycle after cycle {result['from']}"
                + ("" if ours is None else f" ({ours:+.0f} B beyond the control)"),
                "-" if ours is None else f"<= {TARGET_BYTES} B a cycle beyond the control",
                None if ours is None else ours <= TARGET_BYTES,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rss", description=__doc__)
    parser.add_argument("--cycles", type=int, default=10_000)
    parser.add_argument("--warm", type=int, default=100)
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    import torch

    raw = run(args.cycles, args.warm, args.trace, tuple(args.variants.split(",")))
    rows = rows_of(raw)
    print(table(rows))
    print(json.dumps({k: v for k, v in raw.items() if isinstance(v, dict)}, indent=1))
    today = datetime.date.today().isoformat()
    target = args.out or RESULTS / f"{today}-{torch.__version__}-rss.json"
    meta = stats.run_meta(quick=False, seconds=0.0)
    table_rows = [r.__dict__ | {"verdict": r.verdict} for r in rows]
    target.write_text(json.dumps({"meta": meta, "table": table_rows, "raw": raw}, indent=2) + "\n")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
