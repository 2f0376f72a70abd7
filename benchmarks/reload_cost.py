"""Figure 4: destroy + reload of Megatron's group set and of 20/50/100 subgroups, 4 ranks.

A cycle ends when its slowest rank ends, so each repetition's time is the maximum over ranks.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from benchmarks.stats import Row, summarize
from reloadpg_autopatch.tools import launch

ROOT = Path(__file__).resolve().parent.parent


def _scenario(
    name: str, reps: int, world_size: int, env: dict[str, str] | None = None
) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks._reload_rank", "--scenario", name]
    command += ["--reps", str(reps)]
    outcomes = launch.launch(
        command, world_size, timeout=600, cwd=str(ROOT), env={**os.environ, **(env or {})}
    )
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


def released_row(quick: bool = False) -> tuple[Row, dict[str, Any]]:
    """Run length: a cycle after 100 released groups costs what the program's first one did."""
    reps = 3 if quick else 5
    command = [sys.executable, "-m", "benchmarks._released_rank", "--reps", str(reps)]
    outcomes = launch.launch(command, 4, timeout=600, cwd=str(ROOT))
    times: dict[str, dict[int, float]] = {"first": {}, "after release": {}}
    created: dict[str, set[int]] = {"first": set(), "after release": set()}
    for outcome in outcomes:
        for event in outcome.events:
            if event["type"] == "time" and event["variant"] in times:
                per_rep = times[event["variant"]]
                per_rep[event["rep"]] = max(per_rep.get(event["rep"], 0.0), event["ms"])
                created[event["variant"]].add(event["created"])
    first = summarize(list(times["first"].values()))
    after = summarize(list(times["after release"].values()))
    ratio = after.median / first.median - 1
    same_creations = created["first"] == created["after release"]
    row = Row(
        "destroy+reload",
        "after 100 released groups vs the first cycle (20 held, 4 ranks)",
        f"{after.median:.0f} ms [{after.p25:.0f}-{after.p75:.0f}] vs {first.median:.0f} ms "
        f"({ratio:+.1%}); torch created {sorted(created['after release'])} vs "
        f"{sorted(created['first'])} groups per reload",
        "within 10%, same creations",
        ratio <= 0.10 and same_creations,
    )
    raw = {
        "first": first.as_dict(),
        "after_release": after.as_dict(),
        "created": {k: sorted(v) for k, v in created.items()},
    }
    return row, raw


def native_rows(quick: bool = False) -> tuple[list[Row], dict[str, Any]]:
    """Native mode (torch 2.14+): destroy+reload in place against the wrapper mode, and the
    per-call cost, which is nil by construction: collectives are torch's own functions."""
    import torch.distributed as dist

    if not hasattr(dist.ProcessGroup, "reconfigure"):
        return [], {"skipped": "this torch has no ProcessGroup.reconfigure"}
    reps = 3 if quick else 5
    raw = {
        mode: _scenario("megatron", reps, 4, env={"SLIME_RELOADABLE_PG_MODE": mode})
        for mode in ("wrapper", "native")
    }
    wrapper, native = raw["wrapper"]["ours"], raw["native"]["ours"]
    ratio = native["median"] / wrapper["median"] - 1
    probe = raw["native"]["groups"].get("collectives_patched")
    rows = [
        Row(
            "native mode",
            f"Megatron TP=2 group set, destroy+reload in place vs behind wrappers "
            f"({raw['native']['groups'].get('reloadable')} groups/rank)",
            f"native {native['median']:.0f} ms [{native['p25']:.0f}-{native['p75']:.0f}] vs "
            f"wrapper {wrapper['median']:.0f} ms ({ratio:+.1%})",
            "-",
            None,
        ),
        Row(
            "native mode",
            "per-call overhead (all_reduce, get_world_size)",
            "0 ns: torch's own functions"
            if probe is False
            else f"collectives patched: {probe} (a wrapper was needed)",
            "0: no wrapper on the hot path",
            probe is False,
        ),
        Row(
            "native mode",
            "still patched, and why",
            ", ".join(raw["native"]["groups"].get("patched", []))
            + ": they record creations and releases for reload",
            "-",
            None,
        ),
    ]
    return rows, raw


#: Groups held per rank in the native-mode destroy rows (issue 39: one listing per rebuilt
#: group made the destroy quadratic in them).
NATIVE_GROUPS = (10, 100, 400)
#: The destroy per group at the most groups, against at the fewest: linear is about 1.
LINEAR_TARGET = 2.0


def native_destroy_rows(quick: bool = False) -> tuple[list[Row], dict[str, Any]]:
    """Native mode (torch 2.14+) on 4 gloo ranks, every rank a member of every group: the
    destroy's time at 10, 100 and 400 groups (the slowest rank's, per repetition), its sync
    phase (the agreement and the deletes of what the rebuilds wrote), and the store listings
    per cycle."""
    import torch.distributed as dist

    if not hasattr(dist.ProcessGroup, "reconfigure"):
        return [], {"skipped": "this torch has no ProcessGroup.reconfigure"}
    reps = 2 if quick else 3
    raw: dict[str, Any] = {}
    for groups in NATIVE_GROUPS[:2] if quick else NATIVE_GROUPS:
        command = [sys.executable, "-m", "benchmarks._native_rank", "--groups", str(groups)]
        outcomes = launch.launch(
            [*command, "--reps", str(reps)],
            4,
            timeout=900,
            cwd=str(ROOT),
            env={**os.environ, "SLIME_RELOADABLE_PG_MODE": "native"},
        )
        per_rep: dict[int, dict[str, float]] = {}
        for outcome in outcomes:
            for event in outcome.events:
                if event["type"] == "time":
                    slot = per_rep.setdefault(event["rep"], {})
                    for key in ("destroy_ms", "sync_ms", "reload_ms", "listings", "rebuilt"):
                        slot[key] = max(slot.get(key, 0.0), event[key])
        raw[str(groups)] = {
            key: summarize([rep[key] for rep in per_rep.values()]).as_dict()
            for key in ("destroy_ms", "sync_ms", "reload_ms", "listings", "rebuilt")
        }
    rows = []
    for groups, figures in raw.items():
        destroy, sync = figures["destroy_ms"], figures["sync_ms"]
        rows.append(
            Row(
                "native mode",
                f"destroy in place, {groups} groups of 4 gloo ranks (slowest rank; "
                f"{figures['rebuilt']['median']:.0f} rebuilt per reload)",
                f"{destroy['median']:.0f} ms [{destroy['p25']:.0f}-{destroy['p75']:.0f}] "
                f"({destroy['median'] / int(groups):.2f} ms a group), of which the sync phase "
                f"{sync['median']:.1f} ms; reload {figures['reload_ms']['median']:.0f} ms; "
                f"store listings per cycle (most of any rank) {figures['listings']['median']:.0f}",
                "one listing or none per cycle",
                figures["listings"]["median"] <= 1,
            )
        )
    few, many = raw[str(NATIVE_GROUPS[0])], raw.get(str(NATIVE_GROUPS[-1]))
    if many is not None:
        ratio = (many["destroy_ms"]["median"] / NATIVE_GROUPS[-1]) / (
            few["destroy_ms"]["median"] / NATIVE_GROUPS[0]
        )
        rows.append(
            Row(
                "native mode",
                f"destroy per group at {NATIVE_GROUPS[-1]} groups vs at {NATIVE_GROUPS[0]}",
                f"{ratio:.2f}x",
                f"linear in the groups: <= {LINEAR_TARGET:.0f}x",
                ratio <= LINEAR_TARGET,
            )
        )
    return rows, raw
