"""What slime's users keep and gain (issue 17): the memory guard, reload hooks, a cycle report.

slime's wrapper checks free accelerator memory before collectives and, when little is free,
collects garbage and empties the allocator's cache so that NCCL can allocate after a reload; it
adds the memory figures to a collective's exception. This package does the check once per group
after each reload, not on every call, and adds hooks a framework runs around each cycle and a
report of what each cycle did.

Every rank here is activated by the gate alone, on real gloo. CPU has no
accelerator memory query, so the guard's decisions are tested through a memory probe the test
supplies (``set_memory_probe(probe, device_types=("cpu",), clear=...)``): that probe is the one
fake in this file, because nothing real can be measured on CPU. Everything else is observed
from outside the package: the probe's and the hooks' own counters, ``gc.callbacks`` (with the
collector disabled, so that only an explicit ``gc.collect()`` runs it), ``time.perf_counter()``
around each call, the exception's ``__notes__`` against the gate-off run of the same failure,
and the values the collectives return.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.support import guard_ranks, memory_probes
from tests.support.ranks import GATE, Rank, run_ranks, total

pytestmark = pytest.mark.timeout(300)

MIN_FREE_ENV = "SLIME_RELOADABLE_PG_MIN_FREE_GB"
EVERY_CALL_ENV = "SLIME_RELOADABLE_PG_MEMORY_GUARD_EVERY_CALL"
GiB = 2**30
#: Slack for rounding between the package's clock and the test's (ms).
EPS_MS = 2.0


def _reconfigures() -> bool:
    import torch.distributed as dist

    return hasattr(dist.ProcessGroup, "reconfigure")


needs_reconfigure = pytest.mark.skipif(
    not _reconfigures(), reason="native mode needs torch 2.14's ProcessGroup.reconfigure"
)


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


# ---- 3. the environment's switch, and values it does not accept --------------------------------


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


# ---- 5. the note on a collective's exception ------------------------------------------------


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


# ---- 6. reload hooks ------------------------------------------------------------------------


class _Recorder:
    """A hook pair that logs each call with the ids of the groups it got."""

    def __init__(self, label: str, events: list, check: Any = None) -> None:
        self.label, self.events, self.check = label, events, check

    def before_destroy(self, groups: list) -> None:
        self.events.append((self.label, "before_destroy", [id(g) for g in groups]))
        if self.check is not None:
            self.events.append((self.label, "before_destroy:sums", self.check(groups)))

    def after_reload(self, groups: list) -> None:
        self.events.append((self.label, "after_reload", [id(g) for g in groups]))
        if self.check is not None:
            self.events.append((self.label, "after_reload:sums", self.check(groups)))


def _hooks(ctx: Rank) -> dict:
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    guard_ranks.begin(ctx)
    rpg.register_default_process_group(guard_ranks.TIMEOUT, accelerator_backends=("gloo",))
    world = dist.group.WORLD
    a, b, c = (dist.new_group([0, 1]) for _ in range(3))
    ids = {"world": id(world), "a": id(a), "b": id(b), "c": id(c)}
    out: dict[str, Any] = {"ids": ids, "world_type": type(world).__name__}

    type_errors = []
    for kwargs in ({}, {"before_destroy": 42}, {"after_reload": "not callable"}):
        try:
            rpg.add_reload_hook(**kwargs)
            type_errors.append("no error")
        except TypeError:
            type_errors.append("TypeError")
    out["type_errors"] = type_errors

    events: list = []
    # Collectives inside the hooks: before a destroy every group still works, after a reload
    # every group already does.
    first = _Recorder("first", events, check=lambda groups: [total(g, 1.0) for g in groups])
    second = _Recorder("second", events)
    first_handle = rpg.add_reload_hook(
        before_destroy=first.before_destroy, after_reload=first.after_reload, name="first"
    )
    rpg.add_reload_hook(
        before_destroy=second.before_destroy, after_reload=second.after_reload, name="second"
    )
    cycles = []
    for cycle in range(3):
        if cycle == 1:
            dist.destroy_process_group(c)  # let go of on every rank: no longer the hooks' concern
        start = len(events)
        rpg.destroy_process_groups()
        rpg.destroy_process_groups()  # a second destroy in a row does nothing
        destroyed = len(events)
        rpg.reload_process_groups()
        rpg.reload_process_groups()
        cycles.append(
            {
                "destroy": events[start:destroyed],
                "reload": events[destroyed:],
                "sums": [total(g, ctx.rank + 1) for g in (world, a, b)],
            }
        )
    out["cycles"] = cycles

    first_handle.remove()
    first_handle.remove()  # idempotent
    start = len(events)
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    out["after_remove"] = [(label, phase) for label, phase, *_ in events[start:]]

    # A failing hook (on rank 0 only): the step completes, the later hook still runs, and the
    # step raises ReloadHookError naming the hook, caused by its own error.
    raised: list[BaseException] = []
    later: list[str] = []

    def before_boom(groups: list) -> None:
        if ctx.rank == 0:
            raised.append(ValueError("boom before"))
            raise raised[-1]

    def after_boom(groups: list) -> None:
        if ctx.rank == 0:
            raised.append(KeyError("boom after"))
            raise raised[-1]

    boom = rpg.add_reload_hook(before_destroy=before_boom, name="boom-before")
    late = rpg.add_reload_hook(
        before_destroy=lambda groups: later.append("before_destroy"),
        after_reload=lambda groups: later.append("after_reload"),
        name="late",
    )

    def outcome(call: Any) -> dict:
        try:
            call()
            return {"raised": None}
        except Exception as error:
            return {
                "raised": type(error).__name__,
                "hook_error": isinstance(error, rpg.ReloadHookError),
                "runtime_error": isinstance(error, RuntimeError),
                "message": str(error),
                "cause_is_hooks": bool(raised) and error.__cause__ is raised[-1],
            }

    out["failing_before"] = outcome(rpg.destroy_process_groups)
    out["failing_before_later"] = list(later)
    try:  # the destroy completed on this rank: the group has no communicator now
        total(a, 1.0)
        out["destroyed_after_failure"] = False
    except RuntimeError:
        out["destroyed_after_failure"] = True
    before_again = len(later)
    rpg.destroy_process_groups()  # in a row: no hook runs again
    out["second_destroy_hooks"] = len(later) - before_again
    boom.remove()
    rpg.reload_process_groups()
    out["after_failed_destroy_sums"] = [total(g, ctx.rank + 1) for g in (world, a, b)]

    later.clear()
    late.remove()
    rpg.add_reload_hook(after_reload=after_boom)  # named by its __qualname__
    late = rpg.add_reload_hook(
        before_destroy=lambda groups: later.append("before_destroy"),
        after_reload=lambda groups: later.append("after_reload"),
        name="late",
    )
    rpg.destroy_process_groups()
    out["failing_after"] = outcome(rpg.reload_process_groups)
    out["failing_after_later"] = list(later)
    out["after_failed_reload_sums"] = [total(g, ctx.rank + 1) for g in (world, a, b)]
    out["after_boom_qualname"] = after_boom.__qualname__
    late.remove()
    return out


def test_reload_hooks_order_arguments_cycles_removal_and_failures() -> None:
    reports = run_ranks(_hooks, 2, timeout=120, env=GATE)
    for rank, report in enumerate(reports):
        ids = report["ids"]
        assert report["world_type"] == "ReloadableProcessGroup"
        assert report["type_errors"] == ["TypeError"] * 3

        for cycle, seen in enumerate(report["cycles"]):
            held = ["a", "b"] if cycle else ["a", "b", "c"]
            expected = {ids["world"], *(ids[k] for k in held)}
            for phase, step in (("before_destroy", "destroy"), ("after_reload", "reload")):
                calls = [e for e in seen[step] if e[1] == phase]
                # Once per effective step (not for the second call in a row), in registration
                # order, each hook given the same groups.
                assert [label for label, *_ in calls] == ["first", "second"], seen[step]
                for _, _, got in calls:
                    assert len(got) == len(set(got)) == len(expected), (cycle, phase, got, ids)
                    assert set(got) == expected, (cycle, phase, got, ids)
                    mine = [g for g in got if g != ids["world"]]
                    assert mine == [ids[k] for k in held], (cycle, phase, got)  # creation order
                sums = [e for e in seen[step] if e[1] == f"{phase}:sums"]
                assert [s[2] for s in sums] == [[2.0] * len(expected)], (cycle, phase, sums)
                assert len(seen[step]) == 3, seen[step]  # nothing else ran
            assert seen["sums"] == [3.0, 3.0, 3.0]

        assert report["after_remove"] == [("second", "before_destroy"), ("second", "after_reload")]

        failing = report["failing_before"]
        assert report["failing_before_later"] == ["before_destroy"]  # the later hook ran
        assert report["destroyed_after_failure"]
        assert report["second_destroy_hooks"] == 0
        assert report["after_failed_destroy_sums"] == [3.0, 3.0, 3.0]
        failing_after = report["failing_after"]
        assert report["failing_after_later"] == ["before_destroy", "after_reload"]
        assert report["after_failed_reload_sums"] == [3.0, 3.0, 3.0]
        if rank == 1:  # its hooks did not fail
            assert failing == {"raised": None}
            assert failing_after == {"raised": None}
            continue
        for seen_error, name, phase in (
            (failing, "boom-before", "before_destroy"),
            (failing_after, report["after_boom_qualname"], "after_reload"),
        ):
            assert seen_error["raised"] == "ReloadHookError", seen_error
            assert seen_error["hook_error"], seen_error
            assert seen_error["runtime_error"], seen_error
            assert name in seen_error["message"], seen_error
            assert phase in seen_error["message"], seen_error
            assert seen_error["cause_is_hooks"], seen_error
        assert "boom before" in failing["message"]
        assert "boom after" in failing_after["message"]


def _native(ctx: Rank) -> dict:
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    guard_ranks.begin(ctx)
    groups = [dist.new_group([0, 1]) for _ in range(3)]
    events: list = []
    rec = _Recorder("hook", events)
    rpg.add_reload_hook(before_destroy=rec.before_destroy, after_reload=rec.after_reload)
    cycles = []
    with memory_probes.GcRuns() as gc_runs:
        probe = memory_probes.TimelineProbe(gc_runs, free_gib=1.0)
        probe.install()
        for _ in range(2):
            start = len(events)
            destroy_mark = probe.mark()
            rpg.destroy_process_groups()
            in_destroy = probe.since(destroy_mark)
            reload_mark = probe.mark()
            rpg.reload_process_groups()
            in_reload = probe.since(reload_mark)
            use_mark = probe.mark()
            sums = [total(g, ctx.rank + 1) for g in groups for _ in range(2)]
            cycles.append(
                {
                    "destroy": in_destroy,
                    "reload": in_reload,
                    "use": probe.since(use_mark),
                    "sums": sums,
                    "events": events[start:],
                }
            )
    return {
        "types": sorted({type(g).__name__ for g in groups}),
        "ids": [id(g) for g in groups],
        "cycles": cycles,
    }


@needs_reconfigure
def test_native_mode_guards_each_group_inside_reload_and_hooks_get_torchs_groups() -> None:
    reports = run_ranks(_native, 2, timeout=120, env={**GATE, "SLIME_RELOADABLE_PG_MODE": "native"})
    for report in reports:
        assert report["types"] == ["ProcessGroup"]
        for cycle in report["cycles"]:
            assert cycle["sums"] == [3.0] * 6
            # Once per group right before its rebuild (the report may ask the probe too).
            assert cycle["reload"]["clear"] == 3, cycle
            assert cycle["reload"]["probe"] >= 3, cycle
            assert cycle["reload"]["gc"] >= 3, cycle
            assert cycle["destroy"]["clear"] == 0, cycle
            assert cycle["use"] == {"probe": 0, "clear": 0, "gc": 0}, cycle
            assert [(label, phase) for label, phase, _ in cycle["events"]] == [
                ("hook", "before_destroy"),
                ("hook", "after_reload"),
            ], cycle
            for _, _, got in cycle["events"]:
                assert got == report["ids"], cycle  # torch's own objects, in creation order


# ---- 7. the cycle report against the test's own clocks ------------------------------------------


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


# ---- 8. the demo shows the report --------------------------------------------------------------


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
