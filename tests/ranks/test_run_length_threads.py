"""Threads: as ranks, and several threads of one rank.

Threads as ranks (as torch's ``MultiThreadedTestCase`` runs them) behave as with the gate off;
destroy and reload from the rank threads of a threaded world return at once; a second thread of
a rank that destroys while the first one does gets the one-thread error. Oracles: the gate-off
run, collective results, the clock and the exception's type.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import pytest

from tests.support import run_events, this_tree
from tests.support.ranks import GATE, Rank, run_ranks, total

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize(
    ("gate", "policy"),
    [("off", None), ("on", None), ("on", "all")],
    ids=["gate-off", "auto", "all"],
)
def test_threads_as_ranks_behave_as_with_the_gate_off(gate: str, policy: str | None) -> None:
    env = GATE if gate == "on" else {"SLIME_RELOADABLE_PG": None}
    (report,) = run_ranks(
        functools.partial(run_events.threaded_world, policy=policy), 1, timeout=90, env=env
    )
    assert report["hung"] == [], report
    assert report["results"] == {0: [10.0, 3.0], 1: [10.0, 3.0], 2: [10.0], 3: [10.0]}, report


# ---- one step at a time; the rank threads of a threaded world ------------------------------------


def _two_threads_destroy(ctx: Rank) -> dict:
    rpg, dist = this_tree.begin(ctx)
    group = dist.new_group([0])
    inside, second_done = threading.Event(), threading.Event()

    def hold(groups: list) -> None:  # the first destroy waits here for the second call
        inside.set()
        second_done.wait(20)

    rpg.add_reload_hook(before_destroy=hold, name="hold")
    out: dict[str, Any] = {}

    def first() -> None:
        try:
            rpg.destroy_process_groups()
            out["first"] = "no error"
        except Exception as error:
            out["first"] = f"{type(error).__name__}: {error}"

    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    out["entered"] = inside.wait(20)
    started = time.monotonic()
    try:
        rpg.destroy_process_groups()
        out["second"] = "no error"
    except Exception as error:
        out["second"] = str(error)
        out["second_type"] = type(error).__name__
        out["step_in_progress"] = isinstance(error, rpg.StepInProgressError)
    out["second_s"] = time.monotonic() - started
    second_done.set()
    thread.join(30)
    out["first_alive"] = thread.is_alive()
    rpg.reload_process_groups()
    out["sum"] = total(group, 1.0)
    return out


def test_p6_a_second_thread_destroying_at_once_gets_the_one_thread_error() -> None:
    (report,) = run_ranks(_two_threads_destroy, 1, timeout=120, env=GATE)
    assert report["entered"], report
    assert report["step_in_progress"], report
    assert "another thread" in report["second"], report
    assert report["second_s"] < 5, report  # refused at once, not after the first one
    assert report["first"] == "no error", report
    assert not report["first_alive"], report
    assert report["sum"] == 1.0, report


def _threaded_world(ctx: Rank) -> dict:
    import torch
    import torch.distributed as dist

    rpg = this_tree.package()
    assert rpg.is_patched()
    rpg.set_wrap_policy("all")

    def rank(r: int, store: Any) -> dict:
        dist.init_process_group("threaded", rank=r, world_size=4, store=store)
        whole = dist.new_group([0, 1, 2, 3])
        timings = []
        for _cycle in range(2):
            started = time.monotonic()
            rpg.destroy_process_groups()
            between = time.monotonic()
            rpg.reload_process_groups()
            timings += [between - started, time.monotonic() - between]
        t = torch.tensor([r + 1.0])
        dist.all_reduce(t, group=whole)
        result = {"timings": timings, "sum": t.item()}
        dist.destroy_process_group()
        return result

    return run_events.in_rank_threads(rank, 40)


def test_p6_destroy_and_reload_from_the_rank_threads_of_a_threaded_world_return_at_once() -> None:
    (report,) = run_ranks(_threaded_world, 1, timeout=120, env=GATE)
    assert report["hung"] == [], report
    assert set(report["results"]) == {0, 1, 2, 3}, report
    for rank, result in report["results"].items():
        assert isinstance(result, dict), (rank, result)
        assert result["sum"] == 10.0, (rank, result)
        assert all(seconds < 0.5 for seconds in result["timings"]), (rank, result)
