"""Frees under NCCL 2.31's destroy: one order on every rank, and no wait without a deadline.

From NCCL 2.31 on, a communicator's destroy is a barrier among its members with no timeout,
skipped only by an abort. No GPU exists here, so ``tests/support/destroy_barrier.py`` puts that
rule on every gloo group of a rank (a CPU model written for these tests, from NCCL's commit
08016686e as ``docs/limitations.md`` describes it). The oracles are outside the package: the
model's own log of every free each rank made (which group, how it went), the exit of every rank,
the clock, and the error each survivor raises.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.ranks import GATE, Rank, run_ranks

pytestmark = pytest.mark.timeout(240)

#: The groups each run makes, in creation order (every rank calls new_group for each).
GROUPS = ([0, 1], [1, 2], [0, 1, 2], [0, 2], [0, 1])
CYCLES = 12
#: WORLD's timeout in the killed-rank run, and the grace the package documents after it.
WORLD_S = 3.0


def _start(ctx: Rank, timeout: float) -> tuple[Any, Any, Any]:
    import warnings
    from datetime import timedelta

    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from tests.support import destroy_barrier

    warnings.simplefilter("ignore", FutureWarning)
    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    ctx.init(timeout=timeout)
    rpg.register_default_process_group(timedelta(seconds=timeout), accelerator_backends=("gloo",))
    destroy_barrier.install(dist.TCPStore(ctx.host, ctx.port, ctx.world_size, is_master=False))
    return dist, rpg, destroy_barrier


def _cycles(ctx: Rank) -> dict[str, Any]:
    """WORLD swapped and five groups of different members, twelve cycles under the model."""
    dist, rpg, model = _start(ctx, 30.0)
    groups = [dist.new_group(ranks) for ranks in GROUPS]
    mine = [str(g.group_name) for g, ranks in zip(groups, GROUPS, strict=True) if ctx.rank in ranks]
    world = str(dist.group.WORLD.group_name)
    per_cycle = []
    for _ in range(CYCLES):
        before = len(model.FREES)
        rpg.destroy_process_groups()
        per_cycle.append([name for name, _members, _how in model.FREES[before:]])
        rpg.reload_process_groups()
    sums = []
    for group, ranks in zip(groups, GROUPS, strict=True):
        if ctx.rank in ranks:
            t = __import__("torch").tensor([1.0])
            dist.all_reduce(t, group=group)
            sums.append(t.item() == len(ranks))
    return {"mine": mine, "world": world, "per_cycle": per_cycle, "sums": sums}


def test_every_rank_frees_in_creation_order_with_worlds_swap_last() -> None:
    """Each destroy frees this rank's groups in the order they were created (the one order
    every rank shares), WORLD's swap last, cycle after cycle; every free meets its peers (a
    wrong order would wait in the model's barrier for good) and every group works after."""
    for rank, out in enumerate(run_ranks(_cycles, 3, timeout=150, env=GATE)):
        assert len(out["per_cycle"]) == CYCLES
        for cycle, freed in enumerate(out["per_cycle"]):
            ours = [name for name in freed if name in out["mine"]]
            assert ours == out["mine"], (rank, cycle, freed, out["mine"])
            assert freed[-1] == out["world"], (rank, cycle, freed)  # WORLD's swap, last
        assert all(out["sums"]), (rank, out["sums"])


def _dies_in_second_free(ctx: Rank) -> dict[str, Any]:
    """Rank 2 dies inside its second free of the first destroy; the others report."""
    dist, rpg, model = _start(ctx, WORLD_S)
    groups = [dist.new_group([0, 1, 2]) for _ in range(2)]
    for group in groups:
        dist.barrier(group=group)
    second = str(groups[1].group_name)
    if ctx.rank == 2:
        model.die_in_free(2)
    started = time.monotonic()
    try:
        rpg.destroy_process_groups()
    except rpg.ReloadPGError as error:
        outcome = {
            "type": type(error).__name__,
            "missing": getattr(error, "missing", None),
            "message": str(error),
        }
    else:
        outcome = {"type": "returned", "missing": None, "message": ""}
    outcome["seconds"] = time.monotonic() - started
    outcome["frees"] = list(model.FREES)
    outcome["second"] = second
    outcome["use"] = ""
    try:
        dist.all_reduce(__import__("torch").tensor([1.0]), group=groups[1])
    except RuntimeError as error:
        outcome["use"] = type(error).__name__
    return outcome


def test_a_rank_dying_inside_its_free_leaves_no_survivor_waiting() -> None:
    """Rank 2 dies inside its second free (before it reaches the barrier); ranks 0 and 1 wait
    there. Each survivor raises ``PeerMissingError`` naming rank 2 within WORLD's timeout plus
    the documented grace (and the abort), the stuck group was aborted while waiting, WORLD was
    never swapped (that destroy would wait for rank 2 too), and the group refuses use."""
    from reloadpg_autopatch.groups.faults import GRACE_S

    runs = run_ranks(
        _dies_in_second_free,
        3,
        timeout=60,
        env={**GATE, "SLIME_RELOADABLE_PG_LOG": "CRITICAL"},
        may_die=frozenset({2}),
    )
    assert runs[2] is None  # it died
    for rank, out in enumerate(runs[:2]):
        assert out["type"] == "PeerMissingError", (rank, out)
        assert out["missing"] == [2], (rank, out)
        assert out["second"] in out["message"], (rank, out["message"])
        assert out["seconds"] <= WORLD_S + GRACE_S + 3.0, (rank, out["seconds"])
        stuck = [f for f in out["frees"] if f[0] == out["second"]]
        assert [how for _name, _members, how in stuck] == ["aborted while waiting"], out["frees"]
        assert out["frees"][-1][0] == out["second"], (rank, out["frees"])  # WORLD not freed
        assert out["use"] == "GroupBrokenError", (rank, out["use"])


def _dies_in_first_free(ctx: Rank, world_s: float = WORLD_S) -> dict[str, Any]:
    """Rank 2 dies inside its first free of three groups; the survivors' destroy has two left
    to free after the stuck one."""
    dist, rpg, model = _start(ctx, world_s)
    groups = [dist.new_group([0, 1, 2]) for _ in range(3)]
    for group in groups:
        dist.barrier(group=group)
    names = [str(g.group_name) for g in groups]
    if ctx.rank == 2:
        model.die_in_free(1)
    started = time.monotonic()
    try:
        rpg.destroy_process_groups()
        outcome = {"type": "returned", "missing": None}
    except rpg.ReloadPGError as error:
        outcome = {"type": type(error).__name__, "missing": getattr(error, "missing", None)}
    outcome["seconds"] = time.monotonic() - started
    outcome["names"] = names
    outcome["frees"] = list(model.FREES)
    outcome["aborts"] = list(model.ABORTS)
    return outcome


def test_the_groups_left_after_a_stuck_free_are_aborted_never_destroyed() -> None:
    """Rank 2 dies inside its first free: ranks 0 and 1 are stuck in it, and the two groups
    the destroy had left are aborted, never freed (a destroy of each would wait for rank 2
    too, each for another timeout): the model sees no destroy of them, only their aborts, and
    the error comes within one timeout plus the grace. About 9 s: WORLD's timeout and the
    grace, once, and the ranks' start."""
    from reloadpg_autopatch.groups.faults import GRACE_S

    runs = run_ranks(
        _dies_in_first_free,
        3,
        timeout=60,
        env={**GATE, "SLIME_RELOADABLE_PG_LOG": "CRITICAL"},
        may_die=frozenset({2}),
    )
    assert runs[2] is None  # it died
    for rank, out in enumerate(runs[:2]):
        first, *left = out["names"]
        assert (out["type"], out["missing"]) == ("PeerMissingError", [2]), (rank, out)
        hows = {name: how for name, _members, how in out["frees"]}
        assert hows.get(first) == "aborted while waiting", (rank, out["frees"])
        for name in left:
            assert hows.get(name) in (None, "skipped"), (rank, name, out["frees"])
            assert name in out["aborts"], (rank, name, out["aborts"])
        assert out["seconds"] <= WORLD_S + GRACE_S + 3.0, (rank, out["seconds"])


def test_a_frees_deadline_is_the_suspend_timeout_where_it_is_set() -> None:
    """WORLD's timeout 30 s and ``SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT=2``: the survivors of a
    rank dying in its free name it after 2 s and the grace, not after WORLD's timeout. About
    8 s: the variable's 2 s, the grace, and the ranks' start."""
    import functools

    from reloadpg_autopatch.groups.faults import GRACE_S

    limit = 2.0
    runs = run_ranks(
        functools.partial(_dies_in_first_free, world_s=30.0),
        3,
        timeout=90,
        env={
            **GATE,
            "SLIME_RELOADABLE_PG_LOG": "CRITICAL",
            "SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT": str(limit),
        },
        may_die=frozenset({2}),
    )
    assert runs[2] is None  # it died
    for rank, out in enumerate(runs[:2]):
        assert (out["type"], out["missing"]) == ("PeerMissingError", [2]), (rank, out)
        assert limit <= out["seconds"] <= limit + GRACE_S + 3.0, (rank, out["seconds"])


def _abort_never_reaches(ctx: Rank) -> None:
    """As ``_dies_in_second_free``, where no abort can reach the stuck free: this rank's stderr
    goes to a file of the test's, and the time the destroy began before it."""
    import os
    import sys

    path = os.path.join(os.environ["FREES_TEST_DIR"], f"rank{ctx.rank}.err")
    handle = open(path, "w", buffering=1)  # noqa: SIM115 - the rank's process ends with it
    os.dup2(handle.fileno(), 2)
    sys.stderr = handle
    dist, rpg, model = _start(ctx, WORLD_S)
    groups = [dist.new_group([0, 1, 2]) for _ in range(2)]
    model.abort_cannot_reach()
    if ctx.rank == 2:
        model.die_in_free(2)
    handle.write(f"DESTROY BEGINS {time.time()} freeing {groups[1].group_name}\n")
    rpg.destroy_process_groups()
    handle.write("RETURNED\n")  # never: the watchdog ends this process


def test_where_no_abort_reaches_the_stuck_free_the_watchdog_ends_the_process(tmp_path) -> None:
    """Where torch cannot abort the stuck communicator from another thread, the watchdog ends
    each survivor (SIGABRT) about 5 s after the abort, with one message naming the group and
    the rank that never came, and the stacks. About 15 s: WORLD's timeout, the grace, and the
    5 s the abort is given."""
    import re

    from reloadpg_autopatch.groups.faults import GRACE_S
    from reloadpg_autopatch.groups.frees import ABORT_S

    run_ranks(
        _abort_never_reaches,
        3,
        timeout=60,
        env={**GATE, "FREES_TEST_DIR": str(tmp_path)},
        may_die=frozenset({0, 1, 2}),
    )
    for rank in (0, 1):
        path = tmp_path / f"rank{rank}.err"
        text = path.read_text()
        assert "RETURNED" not in text, text[-2000:]
        began = float(re.search(r"DESTROY BEGINS (\S+) freeing (\S+)", text)[1])
        group = re.search(r"DESTROY BEGINS \S+ freeing (\S+)", text)[1]
        ends = [line for line in text.splitlines() if "this process ends here" in line]
        assert len(ends) == 1, text[-3000:]
        assert f"freeing group '{group}'" in ends[0], ends[0]
        assert "ranks 2 never reached it" in ends[0], ends[0]
        assert "Stack" in text or "File " in text, text[-2000:]  # the stacks follow
        took = path.stat().st_mtime - began
        assert WORLD_S + GRACE_S + ABORT_S - 1 <= took <= WORLD_S + GRACE_S + ABORT_S + 6, took
