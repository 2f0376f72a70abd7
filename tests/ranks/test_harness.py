"""The rank harness itself (``tests/support/ranks.py``): every other rank test trusts it.

A rank that raises, dies or hangs fails the run naming it, within the deadline; a rank allowed
to die may; each rank starts with the test's environment, as a process of its own whose exit
runs what a spawned rank's exit runs (its ``atexit`` callbacks). Both ways of starting ranks
are checked: forked from a warm parent (the default) and freshly spawned (``fresh=True``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.support.ranks import Rank, RankFailure, run_ranks

pytestmark = pytest.mark.timeout(120)

STARTS = [pytest.param(False, id="forked"), pytest.param(True, id="spawned")]


def _report(ctx: Rank) -> dict:
    import torch.distributed  # noqa: F401 - where the gate's hook patches

    import reloadpg_autopatch

    return {
        "rank": ctx.rank,
        "pid": os.getpid(),
        "variable": os.environ.get("HARNESS_PROBE"),
        "patched": reloadpg_autopatch.is_patched(),
    }


@pytest.mark.parametrize("fresh", STARTS)
def test_each_rank_runs_in_its_own_process_with_the_tests_environment(fresh: bool) -> None:
    env = {"HARNESS_PROBE": "seen", "SLIME_RELOADABLE_PG": "1"}
    reports = run_ranks(_report, 2, env=env, fresh=fresh)
    assert [r["rank"] for r in reports] == [0, 1]
    assert len({r["pid"] for r in reports} | {os.getpid()}) == 3
    assert all(r["variable"] == "seen" for r in reports)
    assert all(r["patched"] for r in reports)  # the gate, read at the start of each rank
    off = run_ranks(_report, 1, env={"SLIME_RELOADABLE_PG": None}, fresh=fresh)
    assert off[0]["patched"] is False
    assert off[0]["variable"] is None


def _raises(ctx: Rank) -> None:
    if ctx.rank == 1:
        raise ValueError("rank one says no")


def _dies(ctx: Rank) -> int:
    if ctx.rank == 1:
        os._exit(3)
    return ctx.rank


def _hangs(ctx: Rank) -> None:
    if ctx.rank == 0:
        time.sleep(60)


@pytest.mark.parametrize("fresh", STARTS)
def test_a_rank_that_raises_dies_or_hangs_fails_the_run_naming_it(fresh: bool) -> None:
    with pytest.raises(RankFailure, match=r"rank 1 failed:(.|\n)*ValueError: rank one says no"):
        run_ranks(_raises, 2, fresh=fresh)
    with pytest.raises(RankFailure, match=r"died without a report \(exit codes \{1: 3\}\)"):
        run_ranks(_dies, 2, fresh=fresh)
    started = time.monotonic()
    with pytest.raises(RankFailure, match=r"ranks \[0(, 1)?\] did not finish within 2 s"):
        run_ranks(_hangs, 2, timeout=2, fresh=fresh)
    assert time.monotonic() - started < 15  # the deadline, then the stop: not the sleep
    assert run_ranks(_dies, 2, may_die=frozenset({1}), fresh=fresh) == [0, None]


def _leaves_a_mark(ctx: Rank) -> None:
    import atexit

    mark = Path(os.environ["HARNESS_MARK"]) / f"exit-{ctx.rank}"
    atexit.register(mark.write_text, "ran")


@pytest.mark.parametrize("fresh", STARTS)
def test_a_ranks_exit_runs_its_atexit_callbacks(fresh: bool, tmp_path: Path) -> None:
    run_ranks(_leaves_a_mark, 2, env={"HARNESS_MARK": str(tmp_path)}, fresh=fresh)
    deadline = time.monotonic() + 10
    while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exit-0", "exit-1"]


def _origin(ctx: Rank) -> dict:
    import sys

    return {"torch": "torch" in sys.modules, "parent": os.getppid()}


def test_by_default_ranks_are_forked_from_one_warm_parent_that_imported_torch() -> None:
    env = {"HARNESS_PROBE": "warm"}
    first = run_ranks(_origin, 2, env=env)
    again = run_ranks(_origin, 2, env=env)
    assert all(r["torch"] for r in first + again)  # before the rank imported anything
    parents = {r["parent"] for r in first + again}
    assert len(parents) == 1  # one parent served both runs
    assert parents != {os.getpid()}
    spawned = run_ranks(_origin, 1, env=env, fresh=True)
    assert spawned[0]["torch"] is False
