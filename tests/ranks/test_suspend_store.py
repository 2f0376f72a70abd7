"""Suspend mode's store traffic, and twenty cycles that keep every promise.

A cycle costs each rank two store rounds, the destroy's and the reload's, and nothing else (no
creation, no WORLD traffic), the same at 2 and 4 ranks; the TCPStore server's key count is the
same after each of 20 cycles; and each of those cycles keeps every promise of a sleeping group
(refused while asleep, suspended, torch's sums after, the same objects, no creation). One run
through a counting ``Store`` between torch and the TCPStore, read by the three tests.
"""

from __future__ import annotations

import collections
import os
from typing import Any

import pytest

from tests.support import suspend_ranks
from tests.support.ranks import Rank

pytestmark = pytest.mark.timeout(300)

# ---- store traffic per cycle, and twenty cycles ---------------------------------------


def _counting_store(inner: Any) -> Any:
    """A ``Store`` that forwards every call to ``inner`` and logs ``(operation, key)``."""
    import torch.distributed as dist

    class Counting(dist.Store):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[tuple[str, str]] = []

        def _note(self, op: str, *keys: str) -> None:
            self.ops.extend((op, key) for key in keys)

        def set(self, key, value):
            self._note("set", key)
            inner.set(key, value)

        def get(self, key):
            self._note("get", key)
            return inner.get(key)

        def add(self, key, value):
            self._note("add", key)
            return inner.add(key, value)

        def compare_set(self, key, expected, desired):
            self._note("compare_set", key)
            return inner.compare_set(key, expected, desired)

        def wait(self, keys, timeout=None):
            self._note("wait", *keys)
            return inner.wait(keys) if timeout is None else inner.wait(keys, timeout)

        def check(self, keys):
            self._note("check", *keys)
            return inner.check(keys)

        def multi_get(self, keys):
            self._note("multi_get", *keys)
            return inner.multi_get(keys)

        def multi_set(self, keys, values):
            self._note("multi_set", *keys)
            inner.multi_set(keys, values)

        def delete_key(self, key):
            self._note("delete_key", key)
            return inner.delete_key(key)

        def num_keys(self):
            return inner.num_keys()

        def append(self, key, value):
            self._note("append", key)
            inner.append(key, value)

        def has_extended_api(self):
            return True

    return Counting()


def _cycles(ctx: Rank) -> list[dict[str, Any]]:
    """WORLD on the stand-in; ``SUSPEND_TEST_STORE=counting``: 3 cycles through a counting
    store, ``plain``: 20 cycles on the TCPStore itself."""
    import warnings
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.tools import cpu_nccl as s

    warnings.simplefilter("ignore", FutureWarning)
    s.register()
    rpg.set_reload_mode("suspend")
    leg = suspend_ranks.leg()
    counting = os.environ["SUSPEND_TEST_STORE"] == "counting"
    inner = dist.TCPStore(ctx.host, ctx.port, ctx.world_size, is_master=False)
    store = _counting_store(inner) if counting else inner
    dist.init_process_group(
        leg, store=store, rank=ctx.rank, world_size=ctx.world_size, timeout=timedelta(seconds=60)
    )
    ops: list[tuple[str, str]] = store.ops if counting else []
    rpg.register_default_process_group()
    world = dist.group.WORLD
    pairs = [dist.new_group([r, r + 1], backend=leg) for r in range(0, ctx.world_size, 2)]
    everyone = dist.new_group(backend=leg)
    cpu = dist.new_group(backend="gloo")  # stays awake: barriers that touch no store
    mine = pairs[ctx.rank // 2]
    groups = [world, mine, everyone]
    ids = [id(g) for g in groups]
    pg_map = sorted(id(k) for k in c10d._world.pg_map)
    made = s.creations()
    cycles = 3 if counting else 20
    report = []
    for _ in range(cycles):
        start = len(ops)
        rpg.destroy_process_groups()
        destroy = ops[start:]
        asleep = [
            suspend_ranks.outcome(lambda g=g: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))[0]
            for g in groups
        ]
        suspended = [b.state for b in s.backends(leg)]
        listed_asleep = [g is world for g in rpg.reloadable_groups()]
        start = len(ops)
        rpg.reload_process_groups()
        reload = ops[start:]
        sums = [suspend_ranks.rank_sum(dist, torch, ctx.rank, g) for g in groups]
        listed_awake = [g is world for g in rpg.reloadable_groups()]
        dist.barrier(group=cpu)  # every rank is through its reload
        keys = inner.num_keys() if ctx.rank == 0 else None
        dist.barrier(group=cpu)  # nobody starts the next cycle before rank 0 counted
        report.append(
            {
                "destroy": destroy,
                "reload": reload,
                "asleep": asleep,
                "suspended": suspended,
                "sums": sums,
                "world is": dist.group.WORLD is world,
                "ids same": [id(g) for g in groups] == ids,
                "pg_map same": sorted(id(k) for k in c10d._world.pg_map) == pg_map,
                "creations": s.creations() - made,
                "num_keys": keys,
                "listed": [listed_asleep, listed_awake],
            }
        )
    return report


def _round_of(ops: list[tuple[str, str]]) -> tuple[collections.Counter, set[str]]:
    """The operations of one step, and the rounds (key prefixes) they wrote or waited on."""
    kinds = collections.Counter(op for op, _ in ops)
    rounds = {key.rpartition("/")[0] for op, key in ops if op != "delete_key"}
    return kinds, rounds


#: One store round, as ``rendezvous`` documents it: every rank appends its entry, counts in,
#: waits for the result and reads it; the last to arrive also reads the entries, writes the
#: result and deletes the entries, the counter and the previous round's result (through the
#: inner store: torch's ``PrefixStore`` cannot delete through a Python ``Store``).
ROUND = collections.Counter({"append": 1, "add": 1, "wait": 1, "compare_set": 1})
LAST = collections.Counter({"append": 1, "add": 1, "wait": 1, "compare_set": 2, "set": 1})


def _one_round(ops: list[tuple[str, str]]) -> str | None:
    """None when ``ops`` is exactly one round of one rank (as ``ROUND``, or ``LAST``)."""
    kinds, rounds = _round_of(ops)
    deletes = kinds.pop("delete_key", 0)
    if len(rounds) != 1:
        return f"{len(rounds)} rounds: {sorted(rounds)}"
    if not all("reloadpg_autopatch/" in key for _, key in ops):
        return f"keys outside the package's rounds: {ops}"
    if (kinds, deletes) == (ROUND, 0) or (kinds == LAST and deletes in (2, 3)):
        return None
    return f"not one round: {dict(kinds)}, {deletes} deletes"


def test_a_cycle_costs_each_rank_two_store_rounds_at_two_and_four_ranks() -> None:
    """Store traffic per rank per cycle, counted between torch and the TCPStore: the destroy
    is exactly one round and the reload exactly one (each rank: an append, an add, a wait and
    a read; the last to arrive also merges and tidies), under two different keys, and nothing
    else (no creation, no WORLD traffic); the same per-rank figures at 2 and 4 ranks."""
    per_size = {
        n: suspend_ranks.run_once(_cycles, n, timeout=240, SUSPEND_TEST_STORE="counting")
        for n in (2, 4)
    }
    shapes = {}
    for n, ranks in per_size.items():
        for rank, cycles in enumerate(ranks):
            for number, cycle in enumerate(cycles, start=1):
                for step in ("destroy", "reload"):
                    problem = _one_round(cycle[step])
                    assert problem is None, (n, rank, number, step, problem)
                _, destroy_round = _round_of(cycle["destroy"])
                _, reload_round = _round_of(cycle["reload"])
                assert destroy_round != reload_round, (n, rank, number)
        # Per step: how many ranks made how many operations (cycle 2 on: no one-off costs).
        shapes[n] = {
            step: sorted(len(cycles[1][step]) for cycles in ranks) for step in ("destroy", "reload")
        }
    for step in ("destroy", "reload"):
        small, large = shapes[2][step], shapes[4][step]
        assert large[:-1] == [small[0]] * 3, (step, small, large)
        assert large[-1] == small[-1], (step, small, large)


def test_the_store_does_not_grow_over_twenty_cycles() -> None:
    """The TCPStore server's ``num_keys()`` after each of 20 cycles is the same: each round
    deletes what the one before it left."""
    cycles = suspend_ranks.run_once(_cycles, 2, timeout=240, SUSPEND_TEST_STORE="plain")[0]
    assert len(cycles) == 20
    counts = [cycle["num_keys"] for cycle in cycles]
    assert len(set(counts)) == 1, counts


def test_twenty_cycles_with_world_on_the_stand_in_keep_every_promise() -> None:
    """Each of 20 cycles with WORLD registered on the stand-in: every group refused while
    asleep and every backend suspended, torch's sums after, WORLD and every group the same
    objects, torch's ``pg_map`` unchanged, no creation, and ``reloadable_groups()`` lists the
    two groups, never WORLD, asleep as awake."""
    for rank, cycles in enumerate(
        suspend_ranks.run_once(_cycles, 2, timeout=240, SUSPEND_TEST_STORE="plain")
    ):
        for number, cycle in enumerate(cycles, start=1):
            assert cycle["asleep"] == ["GroupSuspendedError"] * 3, (rank, number)
            assert cycle["suspended"] == ["suspended"] * 3, (rank, number)  # WORLD, pair, all
            assert cycle["sums"] == [3.0, 3.0, 3.0], (rank, number)
            assert cycle["world is"], number
            assert cycle["ids same"], number
            assert cycle["pg_map same"], number
            assert cycle["creations"] == 0, (rank, number)
            # WORLD, asleep suspended and awake, is never listed; its two groups are
            assert cycle["listed"] == [[False, False]] * 2, (rank, number, cycle["listed"])
