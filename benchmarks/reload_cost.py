"""Figure 4: destroy + reload of Megatron's group set and of 20/50/100 subgroups, 4 ranks.

A cycle ends when its slowest rank ends, so each repetition's time is the maximum over ranks.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from benchmarks.stats import Row, summarize
from reloadpg_autopatch.tools import launch

ROOT = Path(__file__).resolve().parent.parent


def _scenario(name: str, reps: int, world_size: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks._reload_rank", "--scenario", name]
    command += ["--reps", str(reps)]
    outcomes = launch.launch(command, world_size, timeout=600, cwd=str(ROOT))
    times: dict[str, dict[int, float]] = {"torch": {}, "ours": {}}
    groups = {}
    for outcome in outcomes:
        for event in outcome.events:
            if event["type"] == "time":
                per_rep = times[event["variant"]]
                per_rep[event["rep"]] = max(per_rep.get(event["rep"], 0.0), event["ms"])
            elif event["type"] == "groups":
                groups = event
    return {
        "groups": groups,
        **{
            variant: summarize(list(per_rep.values())).as_dict()
            for variant, per_rep in times.items()
        },
    }


def run(quick: bool = False) -> tuple[list[Row], dict[str, Any]]:
    plan = [("megatron", 3 if quick else 5), ("20", 3 if quick else 5), ("50", 3), ("100", 3)]
    if quick:
        plan = plan[:2]
    rows, raw = [], {}
    for name, reps in plan:
        result = _scenario(name, reps, 4)
        raw[name] = result
        ratio = result["ours"]["median"] / result["torch"]["median"] - 1
        label = "Megatron TP=2 group set" if name == "megatron" else f"{name} subgroups"
        rows.append(
            Row(
                "destroy+reload",
                f"{label} ({result['groups'].get('reloadable')} groups/rank)",
                f"ours {result['ours']['median']:.0f} ms [{result['ours']['p25']:.0f}-"
                f"{result['ours']['p75']:.0f}] vs torch {result['torch']['median']:.0f} ms "
                f"({ratio:+.1%})",
                "within 10% of torch",
                ratio <= 0.10,
            )
        )
    return rows, raw
