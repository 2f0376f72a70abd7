"""What a run is told: the cycle report, the doctor and the demo.

The cycle report against the test's own clock and groups; the demo's JSON has a report per
cycle and its bound is 64 ranks; the doctor in a live rank shows the guard, the hooks and the
last cycle, says the guard is off at zero, and exits 1 when the gate is on and the patch failed.
The oracles: ``time.perf_counter()`` around each call, the groups the test made, the exit
status and output of the package's command line run as a subprocess.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from tests.support import guard_ranks, memory_probes, this_tree
from tests.support.ranks import GATE, Rank, run_ranks, total

pytestmark = pytest.mark.timeout(300)

GiB = 2**30
#: Slack for rounding between the package's clock and the test's (ms).
EPS_MS = 2.0


# ---- the cycle report against the test's own clocks ------------------------------------------


def _step_report(step: Any) -> dict:
    return {
        "total_ms": step.total_ms,
        "phases": dict(step.phases),
        "creations": dict(step.creations),
        "groups": {k: list(v) for k, v in step.groups.items()},
    }


def _report(ctx: Rank) -> dict:
    import time

    import torch
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    records = guard_ranks.records(level=20)
    guard_ranks.begin(ctx)
    a, b, c = (dist.new_group([0, 1]) for _ in range(3))
    names = {"a": a.group_name, "b": b.group_name, "c": c.group_name}
    out: dict[str, Any] = {
        "names": names,
        "before_any": rpg.last_cycle_report() is None,
        "accelerator": bool(
            getattr(torch, "accelerator", None) and torch.accelerator.is_available()
        ),
    }
    cycles = []
    with memory_probes.GcRuns() as gc_runs:
        probe = memory_probes.TimelineProbe(gc_runs, free_gib=10.0, step=4096)
        for cycle in range(3):
            row: dict[str, Any] = {}
            hook = None
            if cycle == 1:
                probe.install()  # cycles 1 and 2 have the test's figures; cycle 0 has torch's
                hook = rpg.add_reload_hook(
                    before_destroy=lambda groups: time.sleep(0.3), name="sleeper"
                )
                dist.destroy_process_group(c)  # released on every rank before this destroy
                if ctx.rank == 1:
                    time.sleep(0.5)  # arrives late: rank 0 waits for it in the destroy's sync
            seen = len(records)
            started = time.perf_counter()
            rpg.destroy_process_groups()
            row["destroy_ms"] = (time.perf_counter() - started) * 1e3
            report = rpg.last_cycle_report()
            row["after_destroy"] = {
                "cycle": report.cycle,
                "reload_is_none": report.reload is None,
                "destroy": _step_report(report.destroy),
                "logged": [
                    (r.levelname, r.reloadpg_cycle == report.to_dict())
                    for r in records[seen:]
                    if hasattr(r, "reloadpg_cycle")
                ],
            }
            seen = len(records)
            started = time.perf_counter()
            rpg.reload_process_groups()
            row["reload_ms"] = (time.perf_counter() - started) * 1e3
            report = rpg.last_cycle_report()
            row["cycle"] = report.cycle
            row["destroy"] = _step_report(report.destroy)
            row["reload"] = _step_report(report.reload)
            row["memory"] = {
                key: None if value is None else list(value) for key, value in report.memory.items()
            }
            row["memory_dict"] = report.to_dict()["memory"]
            row["json"] = json.loads(json.dumps(report.to_dict()))
            row["logged"] = [
                (r.levelname, r.reloadpg_cycle == report.to_dict())
                for r in records[seen:]
                if hasattr(r, "reloadpg_cycle")
            ]
            row["sums"] = [total(g, ctx.rank + 1) for g in (a, b)]
            if hook is not None:
                hook.remove()
            cycles.append(row)
    out["cycles"] = cycles
    out["returned"] = [list(f) for f in probe.returned]
    return out


def _check_step(step: dict, measured_ms: float, where: Any) -> None:
    assert step["total_ms"] <= measured_ms + EPS_MS, (where, step, measured_ms)
    assert all(v >= 0 for v in step["phases"].values()), (where, step)
    assert sum(step["phases"].values()) <= step["total_ms"] + EPS_MS, (where, step)


def test_cycle_report_against_the_tests_own_clock_and_groups() -> None:
    reports = run_ranks(_report, 2, timeout=120, env=GATE)
    for rank, report in enumerate(reports):
        names = report["names"]
        assert report["before_any"]
        assert [row["cycle"] for row in report["cycles"]] == [1, 2, 3]
        for index, row in enumerate(report["cycles"]):
            where = (rank, index)
            after = row["after_destroy"]
            assert after["cycle"] == index + 1, (where, after)
            assert after["reload_is_none"], (where, after)
            _check_step(after["destroy"], row["destroy_ms"], where)
            _check_step(row["destroy"], row["destroy_ms"], where)
            _check_step(row["reload"], row["reload_ms"], where)
            assert row["destroy"] == after["destroy"], where  # the reload left it as it was

            held = ["a", "b"] if index else ["a", "b", "c"]
            expected = sorted(names[k] for k in held)
            assert sorted(row["destroy"]["groups"]["destroyed"]) == expected, (where, row)
            groups = row["reload"]["groups"]
            assert sorted(groups["rebuilt"]) == expected, (where, groups)
            assert list(groups["forgotten"]) == ([names["c"]] if index == 1 else []), groups
            assert list(groups["taken_part"]) == [], groups
            creations = row["reload"]["creations"]
            assert sorted(creations) == expected, (where, creations)
            assert sum(creations.values()) <= row["reload"]["total_ms"] + EPS_MS, where

            # Logged at INFO after each step, the record holding the report as a dict.
            assert after["logged"] == [("INFO", True)], (where, after["logged"])
            assert row["logged"] == [("INFO", True)], (where, row["logged"])
            assert row["json"]["cycle"] == index + 1, where

            memory = row["memory"]
            assert set(memory) == {"before_destroy", "after_destroy", "after_reload"}, memory
            if index == 0:
                if not report["accelerator"]:  # torch's own query: nothing to say on CPU
                    assert set(memory.values()) == {None}, (where, memory)
                continue
            # The probe's own readings, taken in the order of the steps.
            for key, figures in memory.items():
                assert figures in report["returned"], (where, key, figures)
            order = [
                report["returned"].index(memory[key])
                for key in ("before_destroy", "after_destroy", "after_reload")
            ]
            assert order == sorted(order), (where, memory, order)
            assert len(set(order)) == 3, (where, memory, order)
            for key, figures in memory.items():
                assert row["memory_dict"][key] == dict(
                    zip(("free", "total", "allocated", "reserved"), figures, strict=True)
                ), (where, key)

        slow = report["cycles"][1]["destroy"]["phases"]
        assert slow.get("hooks", 0) >= 300, (rank, slow)  # the 0.3 s hook
        if rank == 0:
            assert slow.get("sync", 0) >= 400, slow  # waited for rank 1, 0.5 s late
        for row in report["cycles"]:
            assert row["sums"] == [3.0, 3.0]


# ---- the demo's JSON, and the doctor in a live rank ----------------------------------------------


def test_demo_json_has_a_report_per_cycle(installed, tmp_path) -> None:
    from tests.support.venv import clean_env

    proc = installed.run(
        "-m",
        "reloadpg_autopatch",
        "demo",
        "--world-size",
        "2",
        "--cycles",
        "2",
        "--json",
        env=clean_env(),
        cwd=tmp_path,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    assert len(report["cycles"]) == 2
    for index, row in enumerate(report["cycles"]):
        assert "report" in row, row
        shown = row["report"] if isinstance(row["report"], list) else [row["report"]]
        for cycle in shown:
            assert cycle["cycle"] == index + 1, cycle
            assert cycle["destroy"]["total_ms"] > 0, cycle
            assert cycle["reload"]["total_ms"] > 0, cycle
            rebuilt = cycle["reload"]["groups"]["rebuilt"]
            assert rebuilt, cycle
            # Every group the demo holds went through the cycle: destroyed, then rebuilt.
            assert sorted(rebuilt) == sorted(cycle["destroy"]["groups"]["destroyed"]), cycle
            assert set(cycle["memory"]) == {"before_destroy", "after_destroy", "after_reload"}


def _doctor_in_a_live_rank(ctx: Rank) -> dict:
    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.tools import doctor

    guard_ranks.begin(ctx)
    group = guard_ranks.dist_new_group()
    before = doctor.diagnose()
    rpg.add_reload_hook(after_reload=lambda groups: None, name="restore pools")
    rpg.set_memory_guard(1.5)
    rpg.destroy_process_groups()
    asleep = doctor.diagnose()  # the group has no communicator now
    rpg.reload_process_groups()
    after = doctor.diagnose()
    return {
        "asleep": asleep.fidelity["mode"]["backends"],
        "before": before.cycle,
        "after": after.cycle,
        "text": doctor.render(after),
        "name": group.group_name,
        "sum": total(group, 1.0),
    }


def test_doctor_in_a_live_rank_shows_the_guard_the_hooks_and_the_last_cycle() -> None:
    """Called inside a training process, the doctor reports what this process did: the guard's
    settings, the hooks registered, and the last cycle's report (none before the first)."""
    for report in run_ranks(_doctor_in_a_live_rank, 2, timeout=90, env=GATE):
        assert report["sum"] == 2.0
        assert report["asleep"] == {"gloo": "behind a wrapper (the mode is wrapper)"}
        assert report["before"]["last"] is None
        assert report["before"]["hooks"] == []
        after = report["after"]
        assert after["guard"] == {"min_free_gb": 1.5, "every_call": False, "probe": "torch"}
        assert after["hooks"] == ["restore pools"]
        assert after["last"]["cycle"] == 1
        assert after["last"]["reload"]["groups"]["rebuilt"] == [report["name"]]
        text = report["text"]
        assert "  hooks        1 reload hooks: restore pools" in text, text
        assert "  guard        1.5 GiB free wanted before a reloaded group's first" in text, text
        assert re.search(r"  last cycle   cycle 1: destroy [\d.]+ ms .*1 rebuilt", text), text


# ---- the command line: the demo's bound, the doctor's verdicts -----------------------------------


def test_p4_demo_accepts_a_world_of_64_ranks() -> None:
    """The demo's bound is 64 ranks (docs/demo.md): 64 passes the argument checks, 65 does not.
    Nothing is started: a later check (``--cycles -1``) stops the command after the world size
    was judged, and the error it gives says which check it was."""
    env = this_tree.env()
    accepted = this_tree.cli("demo", "--world-size", "64", "--cycles", "-1", env=env)
    assert accepted.returncode == 2, accepted
    assert "--cycles must be 0 or more" in accepted.stderr, accepted.stderr
    assert "--world-size" not in accepted.stderr, accepted.stderr
    refused = this_tree.cli("demo", "--world-size", "65", "--cycles", "-1", env=env)
    assert refused.returncode == 2, refused
    assert "--world-size must be at most 64" in refused.stderr, refused.stderr
    helped = this_tree.cli("demo", "--help", env=env)
    assert helped.returncode == 0, helped
    assert "at most 64" in " ".join(helped.stdout.split()), helped.stdout


def test_p4_the_doctor_says_the_guard_is_off_at_zero() -> None:
    env = this_tree.env(SLIME_RELOADABLE_PG="1", SLIME_RELOADABLE_PG_MIN_FREE_GB="0")
    as_json = this_tree.cli("doctor", "--json", env=env)
    assert as_json.returncode == 0, as_json.stdout + as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["cycle"]["guard"]["min_free_gb"] == 0, report["cycle"]
    assert not [p for p in report["problems"] if "MIN_FREE" in p], report["problems"]
    text = this_tree.cli("doctor", env=env)
    assert text.returncode == 0, text.stdout + text.stderr
    guard = [line.split() for line in text.stdout.splitlines() if line.split()[:1] == ["guard"]]
    assert len(guard) == 1, text.stdout
    assert guard[0][1] == "off", guard


def _doctor(extra: dict[str, str]) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLIME_RELOADABLE_PG")}
    env.update(extra)
    done = subprocess.run(
        [sys.executable, "-m", "reloadpg_autopatch", "doctor"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode


def test_doctor_exits_1_when_the_gate_is_on_and_the_patch_failed() -> None:
    assert _doctor(GATE) == 0  # the control: the same doctor, healthy
    assert _doctor({**GATE, "SLIME_RELOADABLE_PG_INJECT_FAILURE": "patch"}) == 1
