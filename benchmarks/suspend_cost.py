"""The suspend mode: a cycle of Megatron's group set and WORLD, against the same behind wrappers.

Both run on the suspendable stand-in backend (``reloadpg_autopatch/tools/cpu_nccl``: gloo that
models NCCL's suspend protocol), 4 ranks, Megatron TP=2, WORLD registered. A cycle ends when its
slowest rank ends, so each repetition's time is the maximum over ranks. The package's own time
in suspend mode is the cycle's time less the backend's own suspend and resume calls (on a GPU
that is NCCL's work, which no library can avoid).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from benchmarks.stats import Row, summarize
from reloadpg_autopatch.tools import launch

ROOT = Path(__file__).resolve().parent.parent
#: The package's own time in a suspend cycle, at most this share of a wrapper cycle (issue 39).
OWN_SHARE_TARGET = 0.02
#: A round's store operations on every rank (``rendezvous.agree``: append, add, wait, read),
#: and what its last arriver adds: one read of the entries, the result's ``set``, and the
#: deletes of the entries, the counter and the previous round's result.
ROUND_OPS, LAST_ARRIVER_OPS = 4, 5


def _round_costs(rounds: int = 2) -> set[int]:
    """Each rank's store operations in a cycle of ``rounds`` rounds, as the last arriver of
    none, some or all of them: nothing else (no listing, no delete of what nobody created)."""
    return {rounds * ROUND_OPS + k * LAST_ARRIVER_OPS for k in range(rounds + 1)}


def _own_phases(event: dict[str, Any]) -> dict[str, float]:
    """A rank's cycle by phase (the cycle report's), less the backend's own suspend and resume
    calls in the phases that make them; what no phase timed is ``outside the phases``."""
    phases = dict(event.get("phases", {}))
    for step, backend in (("destroy", "suspend_ms"), ("reload", "resume_ms")):
        calls = event.get(backend, 0.0)
        for name in (f"{step} suspend", f"{step} resume"):
            if calls and name in phases:
                phases[name] = max(phases[name] - calls, 0.0)
                calls = 0.0
    own = event["ms"] - event["backend_ms"]
    phases["outside the phases"] = max(own - sum(phases.values()), 0.0)
    return phases


def _mode(mode: str, reps: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks._suspend_rank", "--reps", str(reps)]
    env = {**os.environ, "SLIME_RELOADABLE_PG_MODE": mode}
    outcomes = launch.launch(command, 4, timeout=600, cwd=str(ROOT), env=env)
    per_rep: dict[int, dict[str, Any]] = {}
    groups: dict[str, Any] = {}
    for outcome in outcomes:
        for event in outcome.events:
            if event["type"] == "time":
                slot = per_rep.setdefault(
                    event["rep"], {"ms": 0.0, "own": 0.0, "cpu": 0.0, "phases": {}}
                )
                slot["ms"] = max(slot["ms"], event["ms"])
                slot["cpu"] = max(slot["cpu"], event.get("own_cpu_ms", 0.0))
                own = event["ms"] - event["backend_ms"]
                if own >= slot["own"]:  # the slowest rank's own time, and where it went
                    slot["own"] = own
                    slot["phases"] = _own_phases(event)
                slot.setdefault("created", set()).add(event["created"])
                slot.setdefault("store_ops", set()).add(event["store_ops"])
            elif event["type"] == "groups":
                groups = event
    names = sorted({name for r in per_rep.values() for name in r["phases"]})
    return {
        "groups": groups,
        "cycle": summarize([r["ms"] for r in per_rep.values()]).as_dict(),
        "own": summarize([r["own"] for r in per_rep.values()]).as_dict(),
        "own_cpu": summarize([r["cpu"] for r in per_rep.values()]).as_dict(),
        "own_phases": {
            name: summarize([r["phases"].get(name, 0.0) for r in per_rep.values()]).median
            for name in names
        },
        "created": sorted(set().union(*(r["created"] for r in per_rep.values()))),
        "store_ops": sorted(set().union(*(r["store_ops"] for r in per_rep.values()))),
    }


def call_rows(quick: bool = False) -> tuple[list[Row], dict[str, Any]]:
    """Per-call cost while awake: nothing is wrapped on torch 2.14, measured anyway."""
    import json
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "benchmarks.suspend_call", "15" if quick else "40"],
        cwd=str(ROOT),
        env={**os.environ, "SLIME_RELOADABLE_PG_MODE": "suspend"},
        capture_output=True,
        text=True,
        check=True,
    )
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = []
    for name in ("get_world_size", "all_reduce"):
        ours, control = raw[name]["suspend mode, after a cycle"], raw[name]["control"]
        band = max(abs(control["low"]), abs(control["high"]), 10.0)
        rows.append(
            Row(
                "suspend mode",
                f"per call while awake, {name}: a group after a suspend cycle vs unpatched "
                f"torch ({raw['cycled_type']}; collectives wrapped: {raw['collectives_wrapped']})",
                f"{ours['estimate']:+.0f} ns [{ours['low']:+.0f}..{ours['high']:+.0f}]; noise "
                f"control {control['estimate']:+.0f} ns [{control['low']:+.0f}.."
                f"{control['high']:+.0f}]",
                "0 within noise on torch 2.14",
                None
                if raw["collectives_wrapped"]
                else (abs(ours["estimate"]) <= band if name == "get_world_size" else None),
            )
        )
    return rows, raw


def run(quick: bool = False) -> tuple[list[Row], dict[str, Any]]:
    reps = 3 if quick else 7
    raw = {mode: _mode(mode, reps) for mode in ("wrapper", "suspend")}
    wrapper, suspend = raw["wrapper"], raw["suspend"]
    share = suspend["own"]["median"] / wrapper["cycle"]["median"]
    cpu_share = suspend["own_cpu"]["median"] / wrapper["cycle"]["median"]
    rows = [
        Row(
            "suspend mode",
            f"a cycle of Megatron's set and WORLD ({suspend['groups'].get('reloadable')} "
            "groups/rank, 4 ranks, the stand-in backend)",
            f"suspend {suspend['cycle']['median']:.1f} ms [{suspend['cycle']['p25']:.1f}-"
            f"{suspend['cycle']['p75']:.1f}] (the package's own {suspend['own']['median']:.1f}"
            f" ms) vs behind wrappers {wrapper['cycle']['median']:.1f} ms",
            "the package's own time at most 2% of a wrapper cycle",
            share <= OWN_SHARE_TARGET,
        ),
        Row(
            "suspend mode",
            "the package's own CPU time in a suspend cycle (the busiest rank's main thread, "
            "less the backend's suspend and resume calls): no waiting counted",
            f"{suspend['own_cpu']['median']:.1f} ms [{suspend['own_cpu']['p25']:.1f}-"
            f"{suspend['own_cpu']['p75']:.1f}]: {cpu_share:.1%} of a wrapper cycle",
            "- (what the wall figure above would be on a rank with a core of its own)",
            None,
        ),
        Row(
            "suspend mode",
            f"the package's own time in a suspend cycle by phase (slowest rank; "
            f"{share:.1%} of a wrapper cycle)",
            "; ".join(
                f"{name} {ms:.2f} ms" for name, ms in suspend["own_phases"].items() if ms >= 0.005
            ),
            "-",
            None,
        ),
        Row(
            "suspend mode",
            "groups the backend created per cycle (every rank, every repetition)",
            f"suspend {suspend['created']} vs behind wrappers {wrapper['created']}",
            "0 in suspend mode",
            suspend["created"] == [0],
        ),
        Row(
            "suspend mode",
            "store operations per rank per cycle",
            f"suspend {suspend['store_ops']} vs behind wrappers {wrapper['store_ops']}",
            f"two rounds: {ROUND_OPS} a round on every rank; a round's last arriver "
            f"{LAST_ARRIVER_OPS} more (it reads the entries, publishes the result, deletes 3 "
            "keys)",
            set(suspend["store_ops"]) <= _round_costs(),
        ),
    ]
    call, raw["per_call"] = call_rows(quick)
    return rows + call, raw


if __name__ == "__main__":
    import json

    rows, raw = run(quick="--quick" in sys.argv)
    from benchmarks.stats import table

    print(table(rows))
    print(json.dumps(raw, indent=1))
