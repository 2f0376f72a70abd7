"""Running a step: its plan, the budget, each run's ranks after a GPU check, and what the
script makes of what they said (failures, the step's status, its summary), into the JSON."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from .common import GiB
from .gpu import gpu_memory
from .plan import Facts, Run, Step, run_worst_case
from .record import Record
from .sessions import Ranks
from .wrapper_demo import demo_checks, demo_summary


def _run_failures(
    run: Run, outcome: str, ranks: list[dict[str, Any]], stopped: list[int]
) -> list[str]:
    failures = []
    if outcome == "timeout":
        failures.append(
            f"{run.label}: stopped at its deadline of {run.deadline_s:g} s; "
            f"still running: rank{'s' if len(stopped) > 1 else ''} " + ", ".join(map(str, stopped))
        )
    for entry in ranks:
        where = f"{run.label}, rank {entry['rank']}"
        for check in entry["checks"]:
            if check.get("status") == "failed":
                failures.append(f"{where}: {check.get('name')}: {check.get('detail')}")
        said = False
        for event in entry["events"]:
            if event.get("type") == "error":
                failures.append(f"{where}: {event.get('message')}")
                said = True
        killed = entry["rank"] in stopped
        if outcome != "ok" and entry["exit_code"] not in (0, None) and not said and not killed:
            tail = [t for t in entry["stderr_tail"] if t.strip()]
            failures.append(
                f"{where}: exit code {entry['exit_code']}" + (f": {tail[-1]}" if tail else "")
            )
    if outcome == "crashed" and not failures:
        failures.append(f"{run.label}: a rank ended without saying why")
    return failures


def execute(run: Run, rehearse: bool, record: Record, step: dict[str, Any]) -> dict[str, Any]:
    """Start ``run``'s ranks after checking the GPU; its record, ranks' data included."""
    entry: dict[str, Any] = {
        "label": run.label,
        "program": run.program,
        "world_size": run.world_size,
        "env": run.env,
        "options": list(run.options),
        "deadline_s": run.deadline_s,
        "memory_before": gpu_memory(rehearse),
        "outcome": "running",
        "pids": [],
        "wall_s": None,
        "leftover_groups": [],
        "ranks": [],
        "failures": [],
    }
    if entry["memory_before"].get("ok") is False:
        record.data["warnings"].append(
            f"{step['name']} / {run.label}: the GPU was not free before it: "
            f"{entry['memory_before']}"
        )
    step["runs"].append(entry)

    def news() -> None:  # what the ranks said so far, so that a cut run keeps it too
        entry["ranks"] = _rank_records(ranks.ranks)
        record.write()

    ranks = Ranks(run, rehearse, on_news=news)
    started = time.monotonic()
    try:
        entry["pids"] = ranks.start()
        record.write()  # a cut run shows which ranks were running
        outcome = ranks.watch()
    except BaseException:
        ranks.stop()
        entry["outcome"] = "interrupted"
        entry["wall_s"] = round(time.monotonic() - started, 2)
        entry["ranks"] = _rank_records(ranks.ranks)
        raise
    entry["wall_s"] = round(time.monotonic() - started, 2)
    entry["leftover_groups"] = ranks.left
    rank_records = _rank_records(ranks.ranks)
    if run.program == "demo":
        rank_records[0]["checks"] += demo_checks(run, rank_records, rehearse)
    entry["ranks"] = rank_records
    entry["failures"] = _run_failures(run, outcome, rank_records, ranks.running_at_end)
    entry["stopped_ranks"] = ranks.running_at_end
    if entry["leftover_groups"]:
        entry["failures"].append(f"{run.label}: processes outlived the kill")
    if outcome == "ok" and entry["failures"]:
        outcome = "failed"
    entry["outcome"] = outcome
    for rank in rank_records:
        start = rank["data"].get("memory_at_start") or {}
        if not rehearse and start.get("free") and start["free"] < 0.9 * start.get("total", 0):
            record.data["warnings"].append(
                f"{step['name']} / {run.label}, rank {rank['rank']}: "
                f"{start['free'] / GiB:.1f} of {start['total'] / GiB:.1f} GiB free at its start"
            )
    return entry


def _rank_records(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**r, "stderr_tail": list(r["stderr_tail"])} for r in ranks]


_SEVERITY = {"ok": 0, "failed": 1, "crashed": 2, "timeout": 3, "interrupted": 4}


def run_step(
    step: Step, facts: Facts, record: Record, budget: float
) -> tuple[dict[str, Any], list[Run]]:
    """Plan and run one step, writing the JSON as it starts and as it ends."""
    entry: dict[str, Any] = {
        "name": step.name,
        "title": step.title,
        "status": "running",
        "reason": None,
        "worst_case_s": None,
        "started_s": round(record.elapsed(), 2),
        "wall_s": None,
        "runs": [],
        "summary": {},
        "failures": [],
    }
    record.data["steps"].append(entry)
    runs, reason = step.plan(facts)
    scale = record.data.get("deadline_scale", 1.0)
    if scale != 1.0:
        runs = [dataclasses.replace(r, deadline_s=r.deadline_s * scale) for r in runs]
    worst = sum(run_worst_case(r) for r in runs)
    entry["worst_case_s"] = worst
    left = budget - record.elapsed()
    if reason is None and step.name != "preflight" and worst > left:
        reason = f"budget: needs up to {worst:.0f} s, {max(left, 0):.0f} s left of {budget:g} s"
    if reason is not None:
        entry.update(status="skipped", reason=f"skipped: {reason}", wall_s=0.0)
        record.write()
        return entry, runs
    record.write()
    started = time.monotonic()
    try:
        for run in runs:
            done = execute(run, facts.rehearse, record, entry)
            entry["failures"] += done["failures"]
            record.write()
    except BaseException:
        entry.update(status="interrupted", wall_s=round(time.monotonic() - started, 2))
        entry["reason"] = "interrupted: this script was told to stop"
        raise
    entry["wall_s"] = round(time.monotonic() - started, 2)
    worst_outcome = max((r["outcome"] for r in entry["runs"]), key=_SEVERITY.__getitem__)
    entry["status"] = worst_outcome
    if worst_outcome != "ok":
        entry["reason"] = entry["failures"][0] if entry["failures"] else worst_outcome
    entry["summary"] = _summary(step.name, entry)
    record.data["failures"] += [f"{step.name}: {f}" for f in entry["failures"]]
    record.write()
    return entry, runs


def _summary(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    """The figures a reader wants first, from rank 0 of each run."""
    out: dict[str, Any] = {}
    for run in entry["runs"]:
        if not run["ranks"]:
            continue
        data = run["ranks"][0]["data"]
        if "summary" in data:
            out[run["label"]] = data["summary"]
        elif run["program"] == "demo":
            out[run["label"]] = demo_summary(run["ranks"][0]["events"])
    if name == "preflight" and entry["runs"] and entry["runs"][0]["ranks"]:
        out = {"see": "the top-level 'preflight'"}
    return out
