"""The memory guard (issue 17): what slime's users keep and gain.

slime's wrapper checks free accelerator memory before collectives and, when little is free,
collects garbage and empties the allocator's cache so that NCCL can allocate after a reload; it
adds the memory figures to a collective's exception. This package checks once per group after
each reload (WORLD's stand-in included), not on every call unless asked; exactly the threshold
free collects and clears nothing; ``0`` turns the guard off, and a bad value is reported once;
a failing collective, and the package's own error for an interrupted one, carry the memory note.

Every rank here is activated by the gate alone, on real gloo. CPU has no accelerator memory
query, so the guard's decisions are tested through a memory probe the test supplies
(``tests/support/memory_probes.py``): that probe is the one fake here. Everything else is
observed from outside the package: the probe's own counters, ``gc.callbacks`` (with the
collector disabled, so that only an explicit ``gc.collect()`` runs it), the exception's
``__notes__`` against the gate-off run of the same failure, and the values the collectives
return.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest

from tests.support import guard_ranks, memory_probes, this_tree
from tests.support.ranks import GATE, Rank, run_ranks, total

pytestmark = pytest.mark.timeout(300)

MIN_FREE_ENV = "SLIME_RELOADABLE_PG_MIN_FREE_GB"
EVERY_CALL_ENV = "SLIME_RELOADABLE_PG_MEMORY_GUARD_EVERY_CALL"
GiB = 2**30


def _broadcast(group: Any, rank: int, value: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value if rank == 0 else -1.0])
    dist.broadcast(t, src=0, group=group)
    return t.item()


# ---- 1, 2, 4 and the API off switch: the guard's decisions in wrapper mode ---------------------


def _use(a: Any, b: Any, rank: int, cycle: int, probe: memory_probes.TimelineProbe) -> dict:
    """The first collective on each group, then more: what the probe saw after each."""
    start = probe.mark()
    sums = [total(a, rank + 1)]
    after_a = probe.since(start)["probe"]
    sums.append(total(b, rank + 1))
    after_b = probe.since(start)["probe"]
    for _ in range(2):
        sums += [total(a, rank + 1), total(b, rank + 1)]
    casts = [_broadcast(g, rank, 7.0 + cycle) for g in (a, b, a, b)]
    return {
        "after_first_a": after_a,
        "after_first_b": after_b,
        **probe.since(start),
        "sums": sums,
        "casts": casts,
        "expected_casts": [7.0 + cycle] * 4,
        "collectives": len(sums) + len(casts),
    }


def _guard(ctx: Rank) -> dict:
    import reloadpg_autopatch as rpg

    guard_ranks.begin(ctx)
    out: dict[str, Any] = {}
    with memory_probes.GcRuns() as gc_runs:
        probe = memory_probes.TimelineProbe(gc_runs, free_gib=1.0)  # below slime's 3 GiB
        probe.install()
        out["default_guard"] = tuple(rpg.get_memory_guard())
        a, b, unused = (guard_ranks.dist_new_group() for _ in range(3))
        out["at_creation"] = _use(a, b, ctx.rank, -1, probe)

        low = []
        for cycle in range(3):
            mark = probe.mark()
            rpg.destroy_process_groups()
            rpg.reload_process_groups()
            # The cycle report may ask the probe during the steps; the guard never clears there.
            clear_in_steps = probe.since(mark)["clear"]
            start = len(probe.timeline)
            used = _use(a, b, ctx.rank, cycle, probe)
            used["clear_in_steps"] = clear_in_steps
            used["gc_before_each_clear"] = probe.collected_before_each_clear(start)
            used["devices"] = probe.devices(start)
            low.append(used)
        out["low"] = low

        probe.free_gib = 10.0  # well above the threshold
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        out["high"] = _use(a, b, ctx.rank, 3, probe)

        rpg.set_memory_guard(2.0)
        out["guard_2"] = tuple(rpg.get_memory_guard())
        threshold = {}
        for free in (2.5, 1.5):
            probe.free_gib = free
            rpg.destroy_process_groups()
            rpg.reload_process_groups()
            threshold[str(free)] = _use(a, b, ctx.rank, 4, probe)
        out["threshold"] = threshold

        rpg.set_memory_guard(3.0, every_call=True)
        out["guard_every"] = tuple(rpg.get_memory_guard())
        probe.free_gib = 10.0
        # slime's behaviour checks every call from the moment it is chosen, not from a reload.
        out["every_call_now"] = _use(a, b, ctx.rank, 5, probe)
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        out["every_call"] = _use(a, b, ctx.rank, 5, probe)

        rpg.set_memory_guard(0)
        out["guard_off"] = tuple(rpg.get_memory_guard())
        probe.free_gib = 1.0
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        out["off"] = _use(a, b, ctx.rank, 6, probe)
        del unused
    return out


@pytest.fixture(scope="module")
def guard_reports() -> list[dict]:
    return run_ranks(_guard, 2, timeout=120, env=GATE)


def _collectives_right(used: dict) -> None:
    assert used["sums"] == [3.0] * 6, used
    assert used["casts"] == used["expected_casts"], used


def test_guard_checks_each_used_group_once_after_each_reload(guard_reports) -> None:
    """Three groups, two of them used: two queries per reload, on the first collective of each,
    none at creation, none on the later calls; each low reading collects, then clears."""
    for report in guard_reports:
        assert report["default_guard"] == (3.0, False)
        creation = report["at_creation"]
        assert creation["probe"] == creation["clear"] == creation["gc"] == 0, creation
        _collectives_right(creation)
        assert len(report["low"]) == 3
        for used in report["low"]:
            _collectives_right(used)
            assert used["after_first_a"] == 1, used  # the first collective on the first group
            assert used["after_first_b"] == 2, used  # ... and on the second
            assert used["probe"] == 2, used  # not one query more on the ten later calls
            assert used["clear"] == 2, used  # each reading was below 3 GiB
            assert used["gc"] == 2, used
            assert used["gc_before_each_clear"], used
            assert used["clear_in_steps"] == 0, used  # in wrapper mode, not inside the steps
            assert used["devices"] == ["cpu"], used


def test_guard_above_the_threshold_queries_but_neither_collects_nor_clears(guard_reports) -> None:
    for report in guard_reports:
        high = report["high"]
        _collectives_right(high)
        assert (high["probe"], high["clear"], high["gc"]) == (2, 0, 0), high
        assert report["guard_2"] == (2.0, False)
        above, below = report["threshold"]["2.5"], report["threshold"]["1.5"]
        assert (above["probe"], above["clear"], above["gc"]) == (2, 0, 0), above
        assert (below["probe"], below["clear"], below["gc"]) == (2, 2, 2), below


def test_guard_every_call_queries_before_every_collective(guard_reports) -> None:
    for report in guard_reports:
        assert report["guard_every"] == (3.0, True)
        every = report["every_call"]
        _collectives_right(every)
        assert every["probe"] == every["collectives"] == 10, every
        assert every["after_first_a"] == 1, every
        assert every["after_first_b"] == 2, every
        now = report["every_call_now"]
        _collectives_right(now)
        assert now["probe"] == now["collectives"] == 10, now


def test_guard_set_to_zero_never_queries(guard_reports) -> None:
    for report in guard_reports:
        assert report["guard_off"] == (0.0, False)
        off = report["off"]
        _collectives_right(off)
        assert (off["probe"], off["clear"], off["gc"]) == (0, 0, 0), off


# ---- the environment's switch, and values it does not accept --------------------------------


def _guard_from_env(ctx: Rank) -> dict:
    import reloadpg_autopatch as rpg

    records = guard_ranks.records()  # before anything reads the variable in this rank's own code
    guard_ranks.begin(ctx)
    with memory_probes.GcRuns() as gc_runs:
        probe = memory_probes.TimelineProbe(gc_runs, free_gib=1.0)
        probe.install()
        a, b = guard_ranks.dist_new_group(), guard_ranks.dist_new_group()
        created = _use(a, b, ctx.rank, -1, probe)  # before any reload
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        used = _use(a, b, ctx.rank, 0, probe)
    guard = rpg.get_memory_guard()
    return {
        "guard": (guard.min_free_gb, guard.every_call),
        "created": created,
        "used": used,
        "warnings": [
            r.getMessage()
            for r in records
            if r.levelname == "WARNING" and MIN_FREE_ENV in r.getMessage()
        ],
    }


ENV_CASES = {
    "zero-is-off": ({MIN_FREE_ENV: "0"}, None),
    "negative": ({MIN_FREE_ENV: "-1"}, "-1"),
    "not-a-number-with-every-call": ({MIN_FREE_ENV: "abc", EVERY_CALL_ENV: "1"}, "abc"),
}


@pytest.mark.parametrize("case", list(ENV_CASES))
def test_guard_environment_switch_and_bad_values(case: str, capfd) -> None:
    """``0`` turns the guard off; a value that is no number of GiB >= 0 leaves the rank working
    with slime's 3 GiB and is reported once, naming the variable and the value (in the rank's
    log, or on stderr when it is read at start-up, before the rank's handler exists)."""
    env, bad = ENV_CASES[case]
    reports = run_ranks(_guard_from_env, 2, timeout=90, env={**GATE, **env})
    stderr = [line for line in capfd.readouterr().err.splitlines() if MIN_FREE_ENV in line]
    every = EVERY_CALL_ENV in env
    for report in reports:
        used = report["used"]
        _collectives_right(used)
        if bad is None:
            assert report["guard"] == (0.0, False)
            assert (used["probe"], used["clear"], used["gc"]) == (0, 0, 0), used
            assert report["warnings"] == [], report
        else:
            assert report["guard"] == (3.0, every)
            expected = used["collectives"] if every else 2
            assert used["probe"] == expected, used
            # Every call means every call, from creation on, as slime checks; otherwise a
            # group is checked only after reloads.
            created = report["created"]
            assert created["probe"] == (created["collectives"] if every else 0), created
            assert used["clear"] == expected, used
            assert len(report["warnings"]) <= 1, report["warnings"]  # once, not per call
    if bad is None:
        assert stderr == [], stderr
    else:
        seen = [w for r in reports for w in r["warnings"]] + stderr
        assert seen, "no warning named the variable, in the ranks' log or on stderr"
        assert all(bad in line for line in seen), seen
        assert len(seen) <= 2 * len(reports), seen  # at most once per rank in each place


# ---- the note on a collective's exception ------------------------------------------------


def _failures(dist: Any, group: Any) -> dict[str, BaseException]:
    """Two failures on a valid group, raised before anything is sent, on both torch lanes."""
    import torch

    out = {}
    try:  # gloo's own check: the output list must hold one tensor per rank
        dist.all_gather([torch.zeros(2)], torch.ones(2), group=group)
    except Exception as error:
        out["backend"] = error
    try:  # torch's own check, in Python
        dist.all_reduce(torch.ones(2, dtype=torch.complex64), op=dist.ReduceOp.MAX, group=group)
    except Exception as error:
        out["python"] = error
    return out


def _described(errors: dict[str, BaseException]) -> dict[str, dict]:
    return {
        label: {
            "type": type(error).__name__,
            "message": str(error),
            "notes": list(getattr(error, "__notes__", [])),
        }
        for label, error in errors.items()
    }


def _notes(ctx: Rank) -> dict:
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    guard_ranks.begin(ctx)
    with memory_probes.GcRuns() as gc_runs:
        probe = memory_probes.TimelineProbe(gc_runs, free_gib=1.5, total_gib=79.5)
        probe.install()
        pair = dist.new_group([0, 1])
        out = {
            "figures": list(probe.figures()),
            "pair": {"type": type(pair).__name__, "name": pair.group_name},
            "fresh": _described(_failures(dist, pair)),
        }
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        out["reloaded"] = _described(_failures(dist, pair))  # armed: the guard runs first
        rpg.set_wrap_policy("none")
        plain = dist.new_group([0, 1])
        out["native"] = {
            "type": type(plain).__name__,
            "name": plain.group_name,
            **_described(_failures(dist, plain)),
        }
        out["world"] = {  # group=None: WORLD, native here
            "type": type(dist.group.WORLD).__name__,
            "name": dist.group.WORLD.group_name,
            **_described(_failures(dist, None)),
        }
        rpg.set_memory_probe(None)  # torch's query: no figures for a CPU group
        out["default_probe"] = _described(_failures(dist, pair))
        out["sum"] = total(pair, ctx.rank + 1)
    return out


def _control(ctx: Rank) -> dict:
    import warnings

    import torch.distributed as dist

    warnings.simplefilter("ignore", FutureWarning)
    assert not hasattr(dist.all_gather, "__reloadpg_autopatch__"), "the gate-off run is patched"
    ctx.init(timeout=guard_ranks.TIMEOUT.total_seconds())
    return {
        "group": _described(_failures(dist, dist.new_group([0, 1]))),
        "world": _described(_failures(dist, None)),
    }


def _numbers(text: str) -> list[float]:
    return [float(n) for n in re.findall(r"\d+(?:\.\d+)?", text)]


def test_a_failing_collective_carries_the_memory_note_and_is_otherwise_torchs() -> None:
    control = run_ranks(_control, 2, timeout=90, env={"SLIME_RELOADABLE_PG": None})
    reports = run_ranks(_notes, 2, timeout=90, env=GATE)
    for report, gate_off in zip(reports, control, strict=True):
        torchs = gate_off["group"]
        assert set(torchs) == {"backend", "python"}, torchs
        assert report["pair"]["type"] == "ReloadableProcessGroup"
        assert report["native"]["type"] == "ProcessGroup"
        assert report["world"]["type"] == "ProcessGroup"
        free, total, allocated, reserved = (n / GiB for n in report["figures"])
        for where, name, plain_errors in (
            ("fresh", report["pair"]["name"], torchs),
            ("reloaded", report["pair"]["name"], torchs),
            ("native", report["native"]["name"], torchs),
            ("world", report["world"]["name"], gate_off["world"]),
        ):
            for label, plain in plain_errors.items():
                seen = report[where][label]
                # The program's error, unchanged: type and message as with the gate off.
                assert (seen["type"], seen["message"]) == (plain["type"], plain["message"]), (
                    where,
                    seen,
                    plain,
                )
                ours = [n for n in seen["notes"] if n.startswith("reloadpg_autopatch:")]
                assert len(ours) == 1, (where, seen)
                note = ours[0]
                assert re.search(rf"(?<![\w.]){re.escape(name)}(?![\w.])", note), (where, note)
                for word in ("free", "allocated", "reserved", "GiB"):
                    assert word in note, (where, word, note)
                numbers = _numbers(note)
                for value in (free, total, allocated, reserved):
                    assert any(abs(n - value) < 0.01 for n in numbers), (where, value, note)
        for label in torchs:  # no figures to give: no note
            notes = report["default_probe"][label]["notes"]
            assert not [n for n in notes if n.startswith("reloadpg_autopatch:")], notes
        assert report["sum"] == 3.0


# ---- the memory guard: its boundary, WORLD's stand-in, and the note on our own error --------


def _guard_world(ctx: Rank) -> dict:
    rpg, dist = this_tree.begin(ctx, world=True)
    out: dict[str, Any] = {}
    with memory_probes.GcRuns() as gc_runs:
        probe = memory_probes.EventProbe(gc_runs)
        probe.install()
        rpg.set_memory_guard(2.0)
        a = dist.new_group([0, 1])
        for label, free in (("at", 2 * GiB), ("below", 2 * GiB - 1)):
            probe.free = free
            rpg.destroy_process_groups()
            rpg.reload_process_groups()
            mark = probe.mark()
            sums = [total(a, ctx.rank + 1.0)]
            out[label] = {**probe.since(mark), "sums": sums}

        # WORLD: armed by each reload. Memory is short, so that each check of the guard shows
        # as a clear (the cycle report asks the probe too, but never clears). The first call of
        # any method of an armed group checks, and torch's own new_group calls WORLD's while
        # the reload re-creates the groups: so the count starts with the reload.
        probe.free = 1 * GiB
        reloads = []
        for _cycle in range(2):
            rpg.destroy_process_groups()
            mark = probe.mark()
            rpg.reload_process_groups()
            first = total(None, 1.0)
            after_first = probe.since(mark)["clear"]
            later = [total(None, 1.0) for _ in range(3)]
            reloads.append(
                {"first": after_first, "all": probe.since(mark)["clear"], "sums": [first, *later]}
            )
        out["world_reloads"] = reloads

        # WORLD, settled: no check; with every_call=True chosen now (no reload): every call.
        mark = probe.mark()
        settled = [total(None, 1.0) for _ in range(3)]
        out["world_settled"] = {"clear": probe.since(mark)["clear"], "sums": settled}
        rpg.set_memory_guard(2.0, every_call=True)
        counts = []
        for _ in range(3):
            mark = probe.mark()
            total(None, 1.0)
            counts.append(probe.since(mark)["clear"])
        out["world_every_call"] = counts
        rpg.set_memory_guard(2.0)
    return out


@pytest.fixture(scope="module")
def guard_world_reports() -> list[dict]:
    return run_ranks(_guard_world, 2, timeout=200, env=GATE)


def test_p3_exactly_the_threshold_free_collects_nothing_and_clears_nothing(
    guard_world_reports,
) -> None:
    for report in guard_world_reports:
        at, below = report["at"], report["below"]
        assert at["sums"] == below["sums"] == [3.0], report
        # The guard looked, and found exactly enough: no gc.collect(), no clear.
        assert at["probe"] >= 1, at
        assert (at["gc"], at["clear"]) == (0, 0), at
        # One byte less is short: both run (so the probe and the oracle see them at all).
        assert below["probe"] >= 1, below
        assert below["gc"] >= 1, below
        assert below["clear"] >= 1, below


def test_p3_worlds_stand_in_is_armed_by_each_reload_and_by_every_call(
    guard_world_reports,
) -> None:
    """Each reload arms WORLD's stand-in: WORLD is checked once between the start of the
    reload and its first collective (torch's own ``new_group`` calls WORLD's methods while the
    groups are re-created, and the first call of any method checks), and not again after.
    ``set_memory_guard(every_call=True)`` arms it at once: every collective on WORLD checks."""
    for report in guard_world_reports:
        for cycle in report["world_reloads"]:
            assert cycle["sums"] == [2.0] * 4, cycle
            assert cycle["first"] == 1, cycle  # checked once, by its first collective at the latest
            assert cycle["all"] == 1, cycle  # and the three collectives after it: no more
        assert report["world_settled"]["clear"] == 0, report["world_settled"]
        # every_call=True, chosen while WORLD is live: each collective on WORLD checks.
        assert all(count >= 1 for count in report["world_every_call"]), report


def _interrupted(ctx: Rank) -> dict:
    import torch

    rpg, dist = this_tree.begin(ctx)
    probe = memory_probes.EventProbe(free=int(1.5 * GiB))
    probe.install()
    pair = dist.new_group([0, 1])
    box: dict[str, Any] = {}
    worker = None
    if ctx.rank == 0:

        def stuck() -> None:  # rank 1 never joins this all_reduce
            try:
                dist.all_reduce(torch.ones(1), group=pair)
                box["outcome"] = "no error"
            except Exception as error:
                box["type"] = type(error).__name__
                box["ours"] = isinstance(error, rpg.ReloadPGError)
                box["outcome"] = str(error)
                box["notes"] = [str(n) for n in getattr(error, "__notes__", [])]

        worker = threading.Thread(target=stuck, daemon=True)
        worker.start()
    time.sleep(1.0)  # the worker is blocked in the collective; both ranks destroy now
    rpg.destroy_process_groups()
    if worker is not None:
        worker.join(20)
        box.setdefault("outcome", "hang: still blocked 20 s after destroy")
    rpg.reload_process_groups()
    box["sum"] = total(pair, 1.0)
    return box


@pytest.mark.timeout(300)
def test_p3_the_packages_error_for_an_interrupted_collective_carries_the_memory_note() -> None:
    """A thread blocked in a collective while the group is destroyed gets the package's error,
    and that error (not only the transport's, behind it) carries the memory note with the
    probe's figures."""
    for _attempt in range(3):  # the race has two outcomes; the package's error is the one here
        reports = run_ranks(_interrupted, 2, timeout=120, env=GATE)
        box = reports[0]
        assert [r["sum"] for r in reports] == [2.0, 2.0], reports
        if box.get("ours"):
            break
    assert box.get("ours"), box
    assert "reload_process_groups()" in box["outcome"], box
    notes = [n for n in box["notes"] if n.startswith("reloadpg_autopatch:")]
    assert len(notes) == 1, box
    for figure in ("1.50 GiB", "80.00 GiB", "17.00 GiB", "29.00 GiB"):
        assert figure in notes[0], (figure, notes[0])
