"""Suspend mode (issue 23): communicators sleep in place, every object stays, nothing is made.

``SLIME_RELOADABLE_PG_MODE=suspend`` (or ``set_reload_mode("suspend")``) makes
``destroy_process_groups()`` call each suspendable backend's ``suspend()`` and
``reload_process_groups()`` its ``resume()``, guarding every sleeping group in between. No GPU
exists here, so the backend is the stand-in of ``reloadpg_autopatch/tools/cpu_nccl`` (NCCL's
protocol on gloo; ``docs/suspend-facts.md``): variant A (``"suspendable"``, both lanes) and, on
torch 2.14, variant B (``"suspendable_py"``), which also receives every collective in Python and
logs it.

Every case runs on gloo ranks that the gate alone activated (``tests/support/ranks.py``).
The oracles are outside the package: torch's own results and objects (``id()``, ``_world``'s
maps, ``dist.group.WORLD``), the stand-in's call log (what reached the backend, in which
order, in which state), its creation count, its pretend device's free bytes, a counting
``Store`` between torch and the TCPStore, the exit status and stderr of ranks run as plain
subprocesses, and the exception each call raises. A hang is a failure: every run has a
deadline, and the watchdog's own timeout (``SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT``) is kept short
so that a rank stuck in a suspend barrier ends within seconds instead of 30 minutes.

Several tests read one run (``run_once`` of ``tests/support/suspend_ranks.py`` keeps each
run's result for the session), so that a promise has a test of its own without paying for one
more set of interpreters.
"""

from __future__ import annotations

import collections
import os
import time
from typing import Any

import pytest

from reloadpg_autopatch.tools import cpu_nccl as suspendable
from tests.support import suspend_ranks
from tests.support.ranks import Rank

pytestmark = pytest.mark.timeout(300)

MiB = 2**20
GiB = 2**30


# ---- 1. every dispatcher path refused while asleep, and working after --------------------------


def _dispatch_table(torch: Any, dist: Any, group: Any, rank: int, returned: list[str]) -> dict:
    """Every path into torch's dispatcher, on ``group`` (None: WORLD), as ``name -> call``.

    Each call returns what rank ``rank`` ends up with; an async call appends its name to
    ``returned`` once it has handed back a Work (a guard must raise at the call itself).
    """
    from torch.distributed import _functional_collectives as fc

    peer = 1 - rank
    handle = dist.group.WORLD if group is None else group

    def all_reduce() -> Any:
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, group=group)
        return t.tolist()

    def all_reduce_async() -> Any:
        t = torch.tensor([float(rank + 1)])
        work = dist.all_reduce(t, group=group, async_op=True)
        returned.append("all_reduce_async")
        work.wait()
        return t.tolist()

    def barrier() -> Any:
        dist.barrier(group=group)
        return "passed"

    def broadcast() -> Any:
        t = torch.tensor([float(rank + 7)])
        dist.broadcast(t, src=1, group=group)
        return t.tolist()

    def all_gather_into_tensor() -> Any:
        out = torch.zeros(2)
        dist.all_gather_into_tensor(out, torch.tensor([float(rank)]), group=group)
        return out.tolist()

    def all_gather() -> Any:
        out = [torch.zeros(1), torch.zeros(1)]
        dist.all_gather(out, torch.tensor([float(rank)]), group=group)
        return [t.tolist() for t in out]

    def reduce_scatter_tensor() -> Any:
        out = torch.zeros(1)
        dist.reduce_scatter_tensor(out, torch.tensor([1.0, 2.0]) * (rank + 1), group=group)
        return out.tolist()

    def all_to_all_single() -> Any:
        out = torch.zeros(2)
        dist.all_to_all_single(out, torch.tensor([rank * 10.0, rank * 10.0 + 1]), group=group)
        return out.tolist()

    def all_to_all() -> Any:
        out = [torch.zeros(1), torch.zeros(1)]
        dist.all_to_all(
            out, [torch.tensor([rank * 10.0]), torch.tensor([rank * 10.0 + 1])], group=group
        )
        return [t.tolist() for t in out]

    def reduce() -> Any:
        t = torch.tensor([float(rank + 1)])
        dist.reduce(t, dst=0, group=group)
        return t.tolist() if rank == 0 else "sent"

    def gather() -> Any:
        out = [torch.zeros(1), torch.zeros(1)] if rank == 0 else None
        dist.gather(torch.tensor([float(rank)]), out, dst=0, group=group)
        return [t.tolist() for t in out] if out is not None else "sent"

    def scatter() -> Any:
        out = torch.zeros(1)
        chunks = [torch.tensor([100.0]), torch.tensor([101.0])] if rank == 0 else None
        dist.scatter(out, chunks, src=0, group=group)
        return out.tolist()

    def broadcast_object_list() -> Any:
        objects = [f"from rank {rank}"]
        dist.broadcast_object_list(objects, src=0, group=group)
        return objects

    def all_gather_object() -> Any:
        objects: list[Any] = [None, None]
        dist.all_gather_object(objects, {"rank": rank}, group=group)
        return objects

    def functional_all_reduce() -> Any:
        out = fc.all_reduce(torch.tensor([float(rank + 1)]), "sum", handle)
        returned.append("functional_all_reduce")
        return fc.wait_tensor(out).tolist()

    def send_recv() -> Any:
        if rank == 0:
            dist.send(torch.tensor([5.0]), dst=1, group=group)
            return "sent"
        t = torch.zeros(1)
        dist.recv(t, src=0, group=group)
        return t.tolist()

    def isend_irecv() -> Any:
        out = torch.zeros(1)
        works = [dist.isend(torch.tensor([float(rank + 10)]), dst=peer, group=group)]
        works.append(dist.irecv(out, src=peer, group=group))
        returned.append("isend_irecv")
        for work in works:
            work.wait()
        return out.tolist()

    def batch_isend_irecv() -> Any:
        out = torch.zeros(1)
        ops = [
            dist.P2POp(dist.isend, torch.tensor([float(rank + 20)]), peer, group),
            dist.P2POp(dist.irecv, out, peer, group),
        ]
        works = dist.batch_isend_irecv(ops)
        returned.append("batch_isend_irecv")
        for work in works:
            work.wait()
        return out.tolist()

    def coalescing_manager() -> Any:
        a, b = torch.ones(1), torch.ones(1) * 2
        with dist._coalescing_manager(group=group, async_ops=True) as manager:
            dist.all_reduce(a, group=group)
            dist.all_reduce(b, group=group)
        returned.append("coalescing_manager")
        manager.wait()
        return [a.item(), b.item()]

    def group_method_allreduce() -> Any:
        t = torch.tensor([float(rank + 1)])
        work = handle.allreduce([t])
        returned.append("group_method_allreduce")
        work.wait()
        return t.tolist()

    calls = [
        all_reduce,
        all_reduce_async,
        barrier,
        broadcast,
        all_gather_into_tensor,
        all_gather,
        reduce_scatter_tensor,
        all_to_all_single,
        all_to_all,
        reduce,
        gather,
        scatter,
        broadcast_object_list,
        all_gather_object,
        functional_all_reduce,
        send_recv,
        isend_irecv,
        batch_isend_irecv,
        coalescing_manager,
        group_method_allreduce,
    ]
    return {call.__name__: call for call in calls}


#: What each path gives rank 0 and rank 1 (torch's own numbers, computed by hand).
EXPECTED = {
    "all_reduce": ([3.0], [3.0]),
    "all_reduce_async": ([3.0], [3.0]),
    "barrier": ("passed", "passed"),
    "broadcast": ([8.0], [8.0]),
    "all_gather_into_tensor": ([0.0, 1.0], [0.0, 1.0]),
    "all_gather": ([[0.0], [1.0]], [[0.0], [1.0]]),
    "reduce_scatter_tensor": ([3.0], [6.0]),
    "all_to_all_single": ([0.0, 10.0], [1.0, 11.0]),
    "all_to_all": ([[0.0], [10.0]], [[1.0], [11.0]]),
    "reduce": ([3.0], "sent"),
    "gather": ([[0.0], [1.0]], "sent"),
    "scatter": ([100.0], [101.0]),
    "broadcast_object_list": (["from rank 0"], ["from rank 0"]),
    "all_gather_object": ([{"rank": 0}, {"rank": 1}], [{"rank": 0}, {"rank": 1}]),
    "functional_all_reduce": ([3.0], [3.0]),
    "send_recv": ("sent", [5.0]),
    "isend_irecv": ([11.0], [10.0]),
    "batch_isend_irecv": ([21.0], [20.0]),
    "coalescing_manager": ([2.0, 4.0], [2.0, 4.0]),
    "group_method_allreduce": ([3.0], [3.0]),
}


def _dispatch(ctx: Rank) -> dict[str, Any]:
    leg = os.environ["SUSPEND_TEST_LEG"]
    torch, dist, rpg, s = suspend_ranks.start(ctx, world=leg, register=True)
    world_before = dist.group.WORLD
    tp = dist.new_group([0, 1], backend=leg, group_desc="tp")
    out: dict[str, Any] = {"awake": {}, "asleep": {}, "after": {}, "returned": []}
    tables = {
        "tp": _dispatch_table(torch, dist, tp, ctx.rank, out["returned"]),
        "WORLD": _dispatch_table(torch, dist, None, ctx.rank, out["returned"]),
    }
    for where, table in tables.items():
        out["awake"][where] = {name: suspend_ranks.outcome(call) for name, call in table.items()}
    rpg.destroy_process_groups()
    out["returned"].clear()
    seen = len(s.collectives())
    for where, table in tables.items():
        out["asleep"][where] = {name: suspend_ranks.outcome(call) for name, call in table.items()}
    out["returned_asleep"] = list(out["returned"])
    out["stats_asleep"] = {b.label: b.state for b in s.backends(leg)}
    out["reached_backend_asleep"] = [(c.backend, c.op, c.outcome) for c in s.collectives()[seen:]]
    # A new group while WORLD sleeps: its communicator would be split from WORLD's (nccl2
    # does so at creation, no hook sees it), so it is refused; a gloo group is not.
    out["new_group"] = suspend_ranks.outcome(
        lambda: dist.new_group([0, 1], group_desc="made-asleep")
    )
    gloo = suspend_ranks.outcome(
        lambda: dist.new_group([0, 1], backend="gloo", group_desc="cpu-asleep")
    )
    out["gloo_sum"] = suspend_ranks.outcome(
        lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, gloo[1])
    )
    out["world_after_new_group"] = suspend_ranks.outcome(
        lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank)
    )
    rpg.reload_process_groups()
    out["returned"].clear()
    for where, table in tables.items():
        out["after"][where] = {name: suspend_ranks.outcome(call) for name, call in table.items()}
    out["refused_ever"] = [(c.backend, c.op) for c in s.collectives(refused=True)]
    out["world_same"] = dist.group.WORLD is world_before
    return out


@pytest.mark.parametrize("leg", suspend_ranks.VARIANTS)
def test_every_dispatcher_path_is_refused_while_asleep_and_works_after(leg: str) -> None:
    """WORLD (registered, on the stand-in) and a group on it sleep: every path into torch's
    dispatcher raises ``GroupSuspendedError`` at the call itself (also async ones), naming the
    group and ``reload_process_groups()``; nothing reaches the backend (variant B logs every
    collective it receives); after the reload every path gives torch's numbers again."""
    ranks = suspend_ranks.run_once(_dispatch, SUSPEND_TEST_LEG=leg)
    for rank, out in enumerate(ranks):
        for where in ("tp", "WORLD"):
            for phase in ("awake", "after"):
                want = {name: ("ok", pair[rank]) for name, pair in EXPECTED.items()}
                assert out[phase][where] == want, (rank, where, phase)
            label = "'tp'" if where == "tp" else ""
            for name, (kind, text) in out["asleep"][where].items():
                assert suspend_ranks.is_suspended_error(kind, text, label), (
                    rank,
                    where,
                    name,
                    kind,
                    text,
                )
        assert out["returned_asleep"] == [], f"rank {rank}: async calls returned a Work asleep"
        assert out["reached_backend_asleep"] == [], rank
        assert out["refused_ever"] == [], rank  # no call ever hit a sleeping communicator
        assert set(out["stats_asleep"].values()) == {"suspended"}, out["stats_asleep"]
        assert out["world_same"], rank


@pytest.mark.parametrize("leg", suspend_ranks.VARIANTS)
def test_a_sleeping_world_names_itself_in_the_refusal(leg: str) -> None:
    """The refusal for WORLD says it is WORLD (on 2.13 too, where a wrapper guards it)."""
    for rank, out in enumerate(suspend_ranks.run_once(_dispatch, SUSPEND_TEST_LEG=leg)):
        kind, text = out["asleep"]["WORLD"]["all_reduce"]
        assert kind == "GroupSuspendedError", (rank, kind, text)
        assert "WORLD" in text, (rank, text)


@pytest.mark.parametrize("leg", suspend_ranks.VARIANTS)
def test_new_group_while_world_sleeps_is_refused_and_a_gloo_group_is_not(leg: str) -> None:
    """``new_group`` on WORLD's backend while a suspended WORLD sleeps raises
    ``GroupSuspendedError`` naming WORLD (its communicator would be split from WORLD's: torch
    2.15's nccl2 does so at creation, where no pre-hook sees it; ``tests/ranks/test_nccl2.py``
    shows the split); a gloo group is made and works at once; WORLD stays refused."""
    for rank, out in enumerate(suspend_ranks.run_once(_dispatch, SUSPEND_TEST_LEG=leg)):
        kind, text = out["new_group"]
        assert suspend_ranks.is_suspended_error(kind, text, "WORLD", "new_group()"), (
            rank,
            kind,
            text,
        )
        assert out["gloo_sum"] == ("ok", 3.0), out["gloo_sum"]
        kind, text = out["world_after_new_group"]
        assert kind == "GroupSuspendedError", (rank, kind, text)


# ---- 2. identity: the same objects, the same maps, nothing created ----------------------------


def _identity(ctx: Rank) -> dict[str, Any]:
    from torch.distributed import distributed_c10d as c10d

    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx, world=leg, register=True)
    groups = {
        "WORLD": dist.group.WORLD,
        "tp": dist.new_group([0, 1], backend=leg, group_desc="tp"),
        "dp": dist.new_group([0, 1], backend=leg, group_desc="dp"),
        "cpu": dist.new_group([0, 1], backend="gloo", group_desc="cpu"),
    }
    backends = {name: suspend_ranks.backend(g) for name, g in groups.items() if name != "cpu"}

    def snapshot() -> dict[str, Any]:
        return {
            "WORLD is": dist.group.WORLD is groups["WORLD"],
            "GroupMember.WORLD is": dist.GroupMember.WORLD is groups["WORLD"],
            "default is": c10d._get_default_group() is groups["WORLD"],
            "ids": {name: id(g) for name, g in groups.items()},
            "pg_map": sorted(id(k) for k in c10d._world.pg_map),
            "pg_names": sorted(map(str, c10d._world.pg_names.values())),
            "group_count": c10d._world.group_count,
            "names": {name: str(g.group_name) for name, g in groups.items()},
            "backends same": {
                name: suspend_ranks.backend(groups[name]) is b for name, b in backends.items()
            },
            "creations": s.creations(),
            "sums": {
                name: suspend_ranks.rank_sum(dist, torch, ctx.rank, g) for name, g in groups.items()
            },
        }

    before = snapshot()
    cycles = []
    for _ in range(3):
        rpg.destroy_process_groups()
        asleep_ids = {name: id(g) for name, g in groups.items()}
        rpg.reload_process_groups()
        cycles.append({"asleep ids": asleep_ids, **snapshot()})
    return {"before": before, "cycles": cycles}


def test_every_object_and_map_entry_stays_and_nothing_is_created() -> None:
    """Across cycles ``dist.group.WORLD``, ``GroupMember.WORLD`` and the default group stay
    the object the program saw first, every group's ``id()``, torch's ``pg_map`` keys,
    ``pg_names``, ``group_count`` and names stay as they were, each group's backend is the
    same object, and the stand-in's creator never runs again (zero creations per cycle)."""
    for rank, out in enumerate(suspend_ranks.run_once(_identity)):
        before = out["before"]
        assert before["WORLD is"], before
        assert before["creations"] == 3, before
        assert before["sums"] == {"WORLD": 3.0, "tp": 3.0, "dp": 3.0, "cpu": 3.0}
        for n, cycle in enumerate(out["cycles"], start=1):
            assert cycle["asleep ids"] == before["ids"], (rank, n)
            assert cycle == {"asleep ids": before["ids"], **before}, (rank, n)


# ---- 3 and 10. store traffic per cycle, and twenty cycles ---------------------------------------


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


# ---- 4. agreement: strict refusal, auto fallback, guard only, mixed answers ---------------------


def _refusal(ctx: Rank) -> dict[str, Any]:
    """Strict mode with ``tp`` that rank 1 cannot suspend (``SUSPEND_TEST_HOW``: ``live``: its
    backend stops answering after creation; ``creation``: it said so from the start, as
    ``SUSPENDABLE_UNSUPPORTED=backend@1`` makes it; ``mixed``: initialized on rank 0, not yet
    on rank 1), beside ``dp``, which can."""
    how = os.environ["SUSPEND_TEST_HOW"]
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx)
    if how == "mixed" and ctx.rank == 1:
        s.configure(uninitialized=True)
    if how == "creation" and ctx.rank == 1:  # SUSPENDABLE_UNSUPPORTED=backend@1, for tp only
        s.configure(unsupported="backend")
    tp = dist.new_group([0, 1], backend=leg, group_desc="tp")
    s.configure()
    dp = dist.new_group([0, 1], backend=leg, group_desc="dp")
    if how == "live" and ctx.rank == 1:
        suspend_ranks.backend(tp).settings.unsupported = "backend"
    out: dict[str, Any] = {"tp": str(tp.group_name), "dp": str(dp.group_name)}
    out["destroy"] = suspend_ranks.outcome(rpg.destroy_process_groups)
    out["log"] = suspend_ranks.calls(s)
    out["states"] = [b.state for b in s.backends()]
    out["usable"] = [
        suspend_ranks.outcome(lambda g=g: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))
        for g in (tp, dp)
    ]
    out["reload"] = suspend_ranks.outcome(rpg.reload_process_groups)
    return out


@pytest.mark.parametrize("how", ["live", "creation", "mixed"])
def test_strict_mode_refuses_on_every_rank_with_nothing_suspended(how: str) -> None:
    """``suspend`` mode, a group one rank cannot suspend (its backend stopped answering, or
    said at creation that it does not support suspend, or answers "not initialized" where the
    peer's is initialized): every rank raises ``ModeRefusedError`` with the same text naming
    that group, no suspend reaches any backend on any rank (the other group's neither), and
    every group stays awake and usable."""
    ranks = suspend_ranks.run_once(_refusal, SUSPEND_TEST_HOW=how)
    texts = set()
    for rank, out in enumerate(ranks):
        kind, text = out["destroy"]
        assert kind == "ModeRefusedError", (rank, kind, text)
        assert repr(out["tp"]) in text, text
        assert repr(out["dp"]) not in text, text
        texts.add(text)
        assert [c for c in out["log"] if c[1] in ("suspend", "resume")] == [], out["log"]
        assert set(out["states"]) == {"awake"}, out["states"]
        assert out["usable"] == [("ok", 3.0), ("ok", 3.0)], out["usable"]
        assert out["reload"] == ("ok", None), out["reload"]
    assert len(texts) == 1, texts
    if how == "mixed":
        assert "answered differently" in texts.pop()


def _fallback(ctx: Rank) -> dict[str, Any]:
    """Auto mode: ``tp`` rank 1 cannot suspend any more, ``mx`` answers differently per rank,
    ``dp`` can suspend everywhere."""
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx, mode="auto")
    tp = dist.new_group([0, 1], backend=leg, group_desc="tp")
    if ctx.rank == 1:
        s.configure(uninitialized=True)
    mx = dist.new_group([0, 1], backend=leg, group_desc="mx")
    s.configure()
    dp = dist.new_group([0, 1], backend=leg, group_desc="dp")
    if ctx.rank == 1:
        suspend_ranks.backend(tp).settings.unsupported = "backend"
    groups = {"tp": tp, "mx": mx, "dp": dp}
    ids = {name: id(g) for name, g in groups.items()}
    made = s.creations()
    out: dict[str, Any] = {"names": {n: str(g.group_name) for n, g in groups.items()}}
    out["types"] = {n: type(g).__name__ for n, g in groups.items()}
    out["destroy"] = suspend_ranks.outcome(rpg.destroy_process_groups)
    out["asleep"] = {
        n: suspend_ranks.outcome(lambda g=g: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))
        for n, g in groups.items()
    }
    out["log"] = suspend_ranks.calls(s)
    out["report"] = rpg.last_cycle_report().to_dict()["destroy"]["groups"]
    out["reload"] = suspend_ranks.outcome(rpg.reload_process_groups)
    out["after"] = {
        n: suspend_ranks.outcome(lambda g=g: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))
        for n, g in groups.items()
    }
    out["ids same"] = {n: id(g) == ids[n] for n, g in groups.items()}
    out["creations"] = s.creations() - made
    return out


def test_auto_mode_falls_back_for_the_groups_that_cannot_suspend_and_suspends_the_rest() -> None:
    """``auto`` mode: a group some rank cannot suspend, and one whose members answer
    differently, fall back alike on every rank (torch 2.14, the program holds torch's group:
    it stays resident and usable; torch 2.13, behind a wrapper: destroyed, refused as
    destroyed, and created again by the reload), with no suspend reaching their backends;
    the group that can suspend still does, on every rank."""
    for rank, out in enumerate(suspend_ranks.run_once(_fallback)):
        names = out["names"]
        assert out["destroy"] == ("ok", None), out["destroy"]
        kind, text = out["asleep"]["dp"]
        assert suspend_ranks.is_suspended_error(kind, text, "dp"), (rank, kind, text)
        suspends = [c for c in out["log"] if c[1] == "suspend"]
        assert [c[3] for c in suspends] == ["ok"], suspends  # dp's, and only it
        for name in ("tp", "mx"):
            if suspend_ranks.ON_214:
                assert out["types"][name] == "ProcessGroup"
                assert out["asleep"][name] == ("ok", 3.0), (rank, name)  # resident
                assert any(r.startswith(names[name]) for r in out["report"]["resident"])
            else:
                assert out["types"][name] == "ReloadableProcessGroup"
                assert out["asleep"][name][0] == "GroupDestroyedError", out["asleep"][name]
                assert names[name] in out["report"]["destroyed"]
        assert out["reload"] == ("ok", None), out["reload"]
        assert out["after"] == {"tp": ("ok", 3.0), "mx": ("ok", 3.0), "dp": ("ok", 3.0)}
        assert all(out["ids same"].values())
        assert out["creations"] == (0 if suspend_ranks.ON_214 else 2), out["creations"]


def _left_awake(ctx: Rank) -> dict[str, Any]:
    """Auto mode: rank 1's backend says at creation that it does not support suspend, so rank
    1 leaves ``cr`` torch's own and awake, where rank 0 takes it to suspend; ``dp`` can
    suspend everywhere. Two cycles."""
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(
        ctx, mode="auto", timeout=10.0
    )  # a lone creation: 10 s
    if ctx.rank == 1:
        s.configure(unsupported="backend")
    cr = dist.new_group([0, 1], backend=leg, group_desc="cr")
    s.configure()
    dp = dist.new_group([0, 1], backend=leg, group_desc="dp")
    made = s.creations()
    cr_label = suspend_ranks.backend(cr).label
    out: dict[str, Any] = {"cycles": []}
    for _ in range(2):
        seen = len(s.CALLS)
        destroy = suspend_ranks.outcome(rpg.destroy_process_groups)
        asleep = {
            n: suspend_ranks.outcome(lambda g=g: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))[
                0
            ]
            for n, g in (("cr", cr), ("dp", dp))
        }
        reload = suspend_ranks.outcome(rpg.reload_process_groups)
        cr_log = [c[1] for c in suspend_ranks.calls(s, seen) if c[0] == cr_label]
        after = [
            suspend_ranks.outcome(lambda g=g: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))
            for g in (cr, dp)
        ]
        out["cycles"].append(
            {
                "destroy": destroy,
                "asleep": asleep,
                "reload": reload,
                "cr log": cr_log,
                "after": after,
            }
        )
    out["creations"] = s.creations() - made
    return out


def test_a_group_one_rank_left_awake_at_creation_sleeps_on_no_rank() -> None:
    """``auto`` mode, ``cr`` left awake on rank 1 from its creation (its backend there does
    not support suspend), taken to suspend on rank 0: no rank suspends, destroys or creates
    ``cr`` (rank 0 alone in a barrier or a creation would wait for a peer that never comes),
    it works while the others sleep and after, and ``dp`` still sleeps and wakes."""
    for rank, out in enumerate(suspend_ranks.run_once(_left_awake)):
        for number, cycle in enumerate(out["cycles"], start=1):
            where = (rank, number)
            assert cycle["destroy"] == ("ok", None), (where, cycle["destroy"])
            assert cycle["asleep"] == {"cr": "ok", "dp": "GroupSuspendedError"}, where
            assert cycle["reload"] == ("ok", None), (where, cycle["reload"])
            assert not {"suspend", "resume"} & set(cycle["cr log"]), (where, cycle["cr log"])
            assert cycle["after"] == [("ok", 3.0), ("ok", 3.0)], (where, cycle["after"])
        assert out["creations"] == 0, (rank, out["creations"])


def _guard_only(ctx: Rank) -> dict[str, Any]:
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx)
    tp = dist.new_group([0, 1], backend=leg, group_desc="tp")
    backend = suspend_ranks.backend(tp)
    out: dict[str, Any] = {"name": str(tp.group_name)}
    rpg.destroy_process_groups()
    out["report"] = rpg.last_cycle_report().to_dict()["destroy"]["groups"]
    out["asleep"] = suspend_ranks.outcome(lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, tp))
    out["initialized asleep"] = backend.initialized
    rpg.reload_process_groups()
    out["first cycle"] = suspend_ranks.calls(s)
    out["after"] = suspend_ranks.outcome(lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, tp))
    seen = len(s.CALLS)
    rpg.destroy_process_groups()  # variant B: the collective above created the communicator
    out["second asleep"] = suspend_ranks.outcome(
        lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, tp)
    )
    rpg.reload_process_groups()
    out["second cycle"] = suspend_ranks.calls(s, seen)
    out["second after"] = suspend_ranks.outcome(
        lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, tp)
    )
    out["lazy"] = leg == s.NAME_B  # B's first collective initializes, as NCCL's does
    return out


def test_a_group_no_member_initialized_is_guarded_without_a_suspend() -> None:
    """Every member's communicator says "not initialized" (NCCL's lazy init): the group is
    guarded (refused while asleep, reported as guarded) but no suspend or resume is called,
    and the refused call did not initialize it; once a collective has initialized it
    (variant B, like NCCL), the next cycle suspends and resumes it."""
    for rank, out in enumerate(suspend_ranks.run_once(_guard_only, SUSPENDABLE_UNINITIALIZED="1")):
        assert out["report"].get("guarded") == [out["name"]], out["report"]
        assert out["name"] not in out["report"].get("suspended", []), out["report"]
        kind, text = out["asleep"]
        assert suspend_ranks.is_suspended_error(kind, text, "tp"), (rank, kind, text)
        assert out["initialized asleep"] is False
        assert out["first cycle"] == [], out["first cycle"]
        assert out["after"] == ("ok", 3.0)
        assert out["second asleep"][0] == "GroupSuspendedError"
        calls = [(op, outcome) for _, op, _, outcome in out["second cycle"]]
        if out["lazy"]:
            assert calls == [("suspend", "ok"), ("resume", "ok")], calls
        else:
            assert calls == [], calls
        assert out["second after"] == ("ok", 3.0)


# ---- 5. memory preflight, and a retry ---------------------------------------------------------


#: The preflight's margin in the ranks (``set_memory_guard``), and each group's suspend bytes.
MARGIN_GB = 0.5
NEED = 2 * suspendable.MiB  # two groups of the stand-in's default 1 MiB each


def _preflight(ctx: Rank) -> dict[str, Any]:
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx, margin_gb=MARGIN_GB)
    groups = [dist.new_group([0, 1], backend=leg, group_desc=d) for d in ("tp", "dp")]
    free_before = s.device_memory()[0]
    rpg.destroy_process_groups()
    free_asleep = s.device_memory()[0]
    want = NEED + int(MARGIN_GB * GiB)
    # Rank 0 has exactly what a resume needs; rank 1 one MiB less.
    s.occupy(free_asleep - want + (MiB if ctx.rank == 1 else 0))
    out: dict[str, Any] = {"free": s.device_memory()[0], "need": want}
    seen = len(s.CALLS)
    out["first"] = suspend_ranks.outcome(rpg.reload_process_groups)
    out["first log"] = suspend_ranks.calls(s, seen)
    out["asleep"] = [
        suspend_ranks.outcome(lambda g=g: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))[0]
        for g in groups
    ]
    out["still suspended"] = [suspend_ranks.backend(g).memory_stats()["suspended"] for g in groups]
    s.occupy(None)
    seen = len(s.CALLS)
    out["retry"] = suspend_ranks.outcome(rpg.reload_process_groups)
    out["retry log"] = [(op, outcome) for _, op, _, outcome in suspend_ranks.calls(s, seen)]
    out["after"] = [
        suspend_ranks.outcome(lambda g=g: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))
        for g in groups
    ]
    report = rpg.last_cycle_report().to_dict()
    out["report destroy"] = report["destroy"] is not None
    out["driver_freed_bytes"] = (report["nccl"] or {}).get("driver_freed_bytes")
    out["measured freed"] = free_asleep - free_before
    return out


def test_a_rank_short_of_memory_makes_every_rank_refuse_then_a_retry_works() -> None:
    """Rank 1 lacks one MiB of what a resume needs (the groups' suspend bytes plus the memory
    guard's margin); rank 0 has exactly that. Every rank raises ``MemoryShortError`` with the
    same text, naming rank 1 (not rank 0), the device, its free bytes and the bytes needed; no
    resume reaches any backend, the groups stay refused and suspended. Freed, the retry
    resumes each group once and they give torch's sums."""
    ranks = suspend_ranks.run_once(_preflight)
    texts = {out["first"][1] for out in ranks}
    assert len(texts) == 1, texts
    text = texts.pop()
    shorty = ranks[1]
    for rank, out in enumerate(ranks):
        assert out["first"][0] == "MemoryShortError", out["first"]
        assert out["first log"] == [], (rank, out["first log"])
        assert out["asleep"] == ["GroupSuspendedError"] * 2
        assert out["still suspended"] == [1, 1]
        assert out["retry"] == ("ok", None), out["retry"]
        assert out["retry log"] == [("resume", "ok")] * 2, out["retry log"]
        assert out["after"] == [("ok", 3.0), ("ok", 3.0)]
    assert "rank 1 " in text, text
    assert "rank 0 " not in text, text
    assert " cpu " in text, text
    assert f"{shorty['free'] / MiB:.2f} MiB free" in text, (shorty["free"], text)
    assert f"needs {shorty['need'] / MiB:.2f} MiB" in text, (shorty["need"], text)


def test_a_retried_reload_keeps_the_report_of_its_cycle() -> None:
    """After a ``MemoryShortError`` and a successful retry, the cycle report is still the
    report of that cycle: its destroy is there, and the driver's freed bytes are what the
    pretend device gained during the destroy."""
    for rank, out in enumerate(suspend_ranks.run_once(_preflight)):
        assert out["report destroy"], f"rank {rank}: the retry dropped the destroy's report"
        assert out["driver_freed_bytes"] == out["measured freed"] == NEED, (rank, out)


# ---- 6. a suspend or a resume that raises: the group is broken, the others go on ----------------


def _broken(ctx: Rank) -> dict[str, Any]:
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx)
    s.configure(fail_after_barrier="suspend")
    bad_s = dist.new_group([0, 1], backend=leg, group_desc="bad-suspend")
    s.configure(fail_after_barrier="resume")
    bad_r = dist.new_group([0, 1], backend=leg, group_desc="bad-resume")
    s.configure()
    good = dist.new_group([0, 1], backend=leg, group_desc="good")
    groups = {"bad-suspend": bad_s, "bad-resume": bad_r, "good": good}

    def use() -> dict[str, tuple[str, Any]]:
        return {
            n: suspend_ranks.outcome(lambda g=g: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))
            for n, g in groups.items()
        }

    out: dict[str, Any] = {
        "destroy": suspend_ranks.outcome(rpg.destroy_process_groups),
        "asleep": use(),
    }
    out["reload"] = suspend_ranks.outcome(rpg.reload_process_groups)
    out["after"] = use()
    out["second destroy"] = suspend_ranks.outcome(rpg.destroy_process_groups)
    out["second asleep"] = use()
    out["second reload"] = suspend_ranks.outcome(rpg.reload_process_groups)
    out["second after"] = use()
    lifecycle = ("suspend", "resume")
    out["log"] = {
        n: [
            (c[1], c[3][:8])
            for c in suspend_ranks.calls(s)
            if c[0] == suspend_ranks.backend(g).label and c[1] in lifecycle
        ]
        for n, g in groups.items()
    }
    return out


def test_a_failed_suspend_or_resume_breaks_that_group_and_the_step_goes_on() -> None:
    """A suspend that raises (after NCCL's barrier) and a resume that raises: the step
    completes for the healthy group and then raises ``GroupBrokenError`` naming the broken
    group and the call; the broken groups refuse every use with ``GroupBrokenError`` from then
    on (asleep, after the reload, a cycle later) and are never suspended or resumed again;
    the healthy group sleeps and wakes every cycle."""
    for rank, out in enumerate(suspend_ranks.run_once(_broken)):
        kind, text = out["destroy"]
        assert kind == "GroupBrokenError", (rank, kind, text)
        assert "suspend" in text, text
        assert "bad-suspend" in text or "'1'" in text, text
        kind, text = out["reload"]
        assert kind == "GroupBrokenError", (rank, kind, text)
        assert "resume" in text, text
        for phase in ("asleep", "second asleep"):
            assert out[phase]["good"][0] == "GroupSuspendedError", (phase, out[phase])
        assert out["after"]["good"] == out["second after"]["good"] == ("ok", 3.0)
        for name in ("bad-suspend", "bad-resume"):
            states = [out[p][name][0] for p in ("after", "second asleep", "second after")]
            assert states == ["GroupBrokenError"] * 3, (rank, name, states)
        assert out["asleep"]["bad-suspend"][0] == "GroupBrokenError"
        assert out["second destroy"] == ("ok", None)
        assert out["second reload"] == ("ok", None)
        assert out["log"]["bad-suspend"] == [("suspend", "raised: ")], out["log"]
        assert out["log"]["bad-resume"] == [("suspend", "ok"), ("resume", "raised: ")]
        assert out["log"]["good"] == [("suspend", "ok"), ("resume", "ok")] * 2


# ---- 6. releases while asleep, and the end of WORLD ---------------------------------------------


def _release(ctx: Rank) -> dict[str, Any]:
    """``SUSPEND_TEST_WHO`` releases ``h`` (``both`` or a rank) while it sleeps
    (``SUSPEND_TEST_WHEN=asleep``) or before the destroy (``awake``)."""
    from torch.distributed import distributed_c10d as c10d

    who, when = os.environ["SUSPEND_TEST_WHO"], os.environ["SUSPEND_TEST_WHEN"]
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(
        ctx, timeout=10.0
    )  # a peer that never comes: 10 s, not 30
    g = dist.new_group([0, 1], backend=leg, group_desc="kept")
    h = dist.new_group([0, 1], backend=leg, group_desc="released")
    h_backend, h_native = suspend_ranks.backend(h), getattr(h, "group", h)
    made = s.creations()
    releases = who == "both" or int(who) == ctx.rank
    out: dict[str, Any] = {"releases": releases}
    if when == "asleep":
        rpg.destroy_process_groups()
    seen = len(s.CALLS)
    if releases:
        dist.destroy_process_group(h)
    out["at release"] = suspend_ranks.calls(s, seen)
    if when == "awake":
        out["destroy"] = suspend_ranks.outcome(rpg.destroy_process_groups)
    out["reload"] = suspend_ranks.outcome(rpg.reload_process_groups)
    out["h log"] = [c[1] for c in suspend_ranks.calls(s, seen) if c[0] == h_backend.label]
    out["h resumes"] = h_backend.resumes
    out["h in pg_map"] = h_native in c10d._world.pg_map
    out["g"] = suspend_ranks.outcome(lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))
    out["second cycle"] = (
        suspend_ranks.outcome(rpg.destroy_process_groups),
        suspend_ranks.outcome(rpg.reload_process_groups),
    )
    out["g after"] = suspend_ranks.outcome(lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))
    out["creations"] = s.creations() - made
    return out


def test_a_group_released_on_every_rank_while_asleep_goes_after_its_resume() -> None:
    """``destroy_process_group(h)`` on every rank while ``h`` sleeps: nothing happens at the
    call; the next reload resumes ``h`` (the stand-in logs the resume before the shutdown
    where its shutdown reaches Python) and then torch forgets it; no group is created for it
    (zero creations), and the other group works through later cycles."""
    for rank, out in enumerate(
        suspend_ranks.run_once(_release, SUSPEND_TEST_WHO="both", SUSPEND_TEST_WHEN="asleep")
    ):
        assert out["at release"] == [], out["at release"]
        assert out["reload"] == ("ok", None), out["reload"]
        assert out["h resumes"] == 1
        assert out["h log"][0] == "resume", out["h log"]
        if "shutdown" in out["h log"]:
            assert out["h log"].index("resume") < out["h log"].index("shutdown"), out["h log"]
        assert not out["h in pg_map"]
        assert out["g"] == out["g after"] == ("ok", 3.0)
        assert out["second cycle"] == (("ok", None), ("ok", None))
        assert out["creations"] == 0, f"rank {rank}: {out['creations']} groups created"


@pytest.mark.parametrize("when", ["asleep", "awake"])
def test_a_group_released_on_one_member_does_not_stall_the_others(when: str) -> None:
    """Rank 1 alone releases ``h`` (while it sleeps, or while awake before the destroy): every
    rank still completes the destroy and the reload, no group is created, and the other group
    works on; nobody waits for a peer that let ``h`` go."""
    ranks = suspend_ranks.run_once(_release, SUSPEND_TEST_WHO="1", SUSPEND_TEST_WHEN=when)
    for rank, out in enumerate(ranks):
        if when == "awake":
            assert out["destroy"] == ("ok", None), (rank, out["destroy"])
        assert out["reload"] == ("ok", None), (rank, out["reload"])
        assert out["g"] == out["g after"] == ("ok", 3.0), rank
        assert out["second cycle"] == (("ok", None), ("ok", None)), rank
        assert out["creations"] == 0, (rank, out["creations"])


def _end_world(ctx: Rank) -> dict[str, Any]:
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx, world=leg, register=True)
    tp = dist.new_group([0, 1], backend=leg, group_desc="tp")
    labels = [b.label for b in s.backends()]
    rpg.destroy_process_groups()
    seen = len(s.CALLS)
    out: dict[str, Any] = {"end": suspend_ranks.outcome(dist.destroy_process_group)}
    out["log"] = [(c[0], c[1], c[3]) for c in suspend_ranks.calls(s, seen)]
    out["labels"] = labels
    out["resumes"] = [b.resumes for b in s.backends()]
    out["initialized"] = dist.is_initialized()
    out["tp"] = suspend_ranks.outcome(lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, tp))[0]
    # A new world on the same store works, with a group that sleeps and wakes.
    from datetime import timedelta

    ctx.reinit("second-world/", timedelta(seconds=30))
    fresh = dist.new_group([0, 1], backend=leg)
    out["fresh cycle"] = (
        suspend_ranks.outcome(rpg.destroy_process_groups),
        suspend_ranks.outcome(rpg.reload_process_groups),
    )
    out["fresh"] = suspend_ranks.outcome(
        lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, fresh)
    )
    return out


def test_ending_world_while_asleep_resumes_every_communicator_first() -> None:
    """``dist.destroy_process_group()`` while WORLD and a group sleep: it returns, every
    suspended backend was resumed once before torch shut it down (the stand-in logs both where
    the shutdown reaches Python), torch is no longer initialized, and a new world works."""
    for rank, out in enumerate(suspend_ranks.run_once(_end_world)):
        assert out["end"] == ("ok", None), out["end"]
        assert out["resumes"] == [1, 1], out["resumes"]
        for label in out["labels"]:
            ops = [op for backend, op, outcome in out["log"] if backend == label]
            assert ops[0] == "resume", (rank, label, ops)
            if "shutdown" in ops:
                assert ops.index("resume") < ops.index("shutdown"), (label, ops)
        assert all(outcome == "ok" for _, _, outcome in out["log"]), out["log"]
        assert out["initialized"] is False
        if (
            not suspend_ranks.ON_214
        ):  # the wrapper says its WORLD ended (2.14: torch's own group, torch's rules)
            assert out["tp"] == "GroupDestroyedError", out["tp"]
        assert out["fresh cycle"] == (("ok", None), ("ok", None))
        assert out["fresh"] == ("ok", 3.0)


# ---- 6. a forked child, and two threads -------------------------------------------------------


def _child(rpg: Any, s: Any, dist: Any, torch: Any, group: Any) -> dict[str, Any]:
    """In a forked child: time destroy and reload, and what reached the stand-in."""
    import json

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into the rank
        try:
            seen = len(s.CALLS)
            started = time.monotonic()
            steps = [
                suspend_ranks.outcome(rpg.destroy_process_groups),
                suspend_ranks.outcome(rpg.reload_process_groups),
            ]
            report = {
                "seconds": time.monotonic() - started,
                "steps": steps,
                "log": suspend_ranks.calls(s, seen, stats=True),
                "use": suspend_ranks.outcome(
                    lambda: suspend_ranks.backend(group).memory_stats()["suspended"]
                ),
            }
        except BaseException as error:
            report = {"error": repr(error)}
        os.write(write, json.dumps(report).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    return {"status": status, **json.loads(b"".join(chunks))}


def _process(ctx: Rank) -> dict[str, Any]:
    import threading

    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx)
    tp = dist.new_group([0, 1], backend=leg, group_desc="tp")
    # Rank 0 alone forks: a child that took part in a step would wait for a peer that never
    # comes (or meet rank 1's child, were both to fork).
    forks = ctx.rank == 0
    out: dict[str, Any] = {"child awake": _child(rpg, s, dist, torch, tp) if forks else None}
    rpg.destroy_process_groups()
    out["child asleep"] = _child(rpg, s, dist, torch, tp) if forks else None
    out["parent asleep"] = suspend_ranks.outcome(
        lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, tp)
    )[0]
    out["parent reload"] = suspend_ranks.outcome(rpg.reload_process_groups)
    out["parent after"] = suspend_ranks.outcome(
        lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, tp)
    )
    # Two threads destroy at once; a slow before-destroy hook keeps the first one inside.
    results: list[tuple[str, Any]] = []
    start = threading.Barrier(2)

    def destroy() -> None:
        start.wait()
        results.append(suspend_ranks.outcome(rpg.destroy_process_groups))

    handle = rpg.add_reload_hook(before_destroy=lambda groups: time.sleep(1.5), name="slow")
    threads = [threading.Thread(target=destroy) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    handle.remove()
    out["threads"] = sorted(results)
    out["threads suspends"] = [op for _, op, _, _ in suspend_ranks.calls(s) if op == "suspend"]
    out["threads reload"] = suspend_ranks.outcome(rpg.reload_process_groups)
    out["threads after"] = suspend_ranks.outcome(
        lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, tp)
    )
    return out


def test_a_forked_child_never_suspends_or_resumes() -> None:
    """``os.fork()`` in rank 0, awake and asleep: the child's ``destroy_process_groups()`` and
    ``reload_process_groups()`` return at once, nothing reaches the stand-in in the child (not
    even ``memory_stats``), and the parents' cycle goes on as if nothing happened."""
    for rank, out in enumerate(suspend_ranks.run_once(_process)):
        for when in ("child awake", "child asleep") if rank == 0 else ():
            child = out[when]
            assert "error" not in child, (rank, when, child)
            assert child["status"] == 0
            assert child["steps"] == [["ok", None], ["ok", None]], child["steps"]
            assert child["seconds"] < 1.0, child["seconds"]
            assert child["log"] == [], (rank, when, child["log"])
        if rank == 0:
            assert out["child asleep"]["use"] == ["ok", 1]  # still asleep in the child
        assert out["parent asleep"] == "GroupSuspendedError"
        assert out["parent reload"] == ("ok", None)
        assert out["parent after"] == ("ok", 3.0)


def test_two_threads_destroying_at_once_get_one_step_and_one_refusal() -> None:
    """Two threads of a rank call ``destroy_process_groups()`` together: one completes (one
    suspend), the other raises ``StepInProgressError``; the reload then works."""
    for rank, out in enumerate(suspend_ranks.run_once(_process)):
        kinds = [kind for kind, _ in out["threads"]]
        assert kinds == ["StepInProgressError", "ok"], (rank, out["threads"])
        assert "another thread" in out["threads"][0][1]
        assert len(out["threads suspends"]) == 2  # the first cycle's and this one
        assert out["threads reload"] == ("ok", None)
        assert out["threads after"] == ("ok", 3.0)


# ---- 7. gloo groups and a gloo WORLD stay awake, untouched ---------------------------------------


def _gloo(ctx: Rank) -> dict[str, Any]:
    from torch.distributed import distributed_c10d as c10d

    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx, register=True, policy="all")
    world = dist.group.WORLD
    cpu = dist.new_group([0, 1], backend="gloo", group_desc="cpu")
    tp = dist.new_group([0, 1], backend=leg, group_desc="tp")
    ids = (id(world), id(cpu), id(c10d._world.default_pg))
    out: dict[str, Any] = {"types": [type(world).__name__, type(cpu).__name__]}
    out["names"] = [str(world.group_name), str(cpu.group_name)]

    def use(group: Any) -> list[Any]:
        t = torch.tensor([float(ctx.rank + 1)])
        dist.all_reduce(t, group=group)
        b = torch.tensor([float(ctx.rank + 7)])
        dist.broadcast(b, src=1, group=group)
        o = torch.zeros(2)
        dist.all_gather_into_tensor(o, torch.tensor([float(ctx.rank)]), group=group)
        dist.barrier(group=group)
        objects = [f"rank {ctx.rank}"]
        dist.broadcast_object_list(objects, src=0, group=group)
        return [t.item(), b.item(), o.tolist(), objects]

    rpg.destroy_process_groups()
    out["asleep"] = [
        suspend_ranks.outcome(lambda: use(None)),
        suspend_ranks.outcome(lambda: use(cpu)),
    ]
    out["tp asleep"] = suspend_ranks.outcome(
        lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, tp)
    )[0]
    out["report"] = rpg.last_cycle_report().to_dict()["destroy"]["groups"]
    rpg.reload_process_groups()
    out["after"] = [
        suspend_ranks.outcome(lambda: use(None)),
        suspend_ranks.outcome(lambda: use(cpu)),
    ]
    out["ids same"] = ids == (id(dist.group.WORLD), id(cpu), id(c10d._world.default_pg))
    out["reloadable"] = [g is dist.group.WORLD or g is cpu for g in rpg.reloadable_groups()]
    out["suspended"] = [b.suspends for b in s.backends()]
    return out


def test_gloo_groups_and_a_gloo_world_stay_awake_and_untouched() -> None:
    """In suspend mode with the ``"all"`` policy and WORLD registered on gloo: WORLD and a
    gloo group stay torch's own objects, are never listed as suspended, guarded, resident or
    destroyed, and work while the stand-in group sleeps (all_reduce, broadcast, all_gather,
    barrier, broadcast_object_list give torch's numbers), before and after the reload."""
    want = ("ok", [3.0, 8.0, [0.0, 1.0], ["rank 0"]])
    for rank, out in enumerate(suspend_ranks.run_once(_gloo)):
        assert out["types"] == ["ProcessGroup", "ProcessGroup"], out["types"]
        assert out["asleep"] == [want, want], (rank, out["asleep"])
        assert out["after"] == [want, want], (rank, out["after"])
        assert out["tp asleep"] == "GroupSuspendedError"
        listed = [n for names in out["report"].values() for n in names]
        for name in out["names"]:
            assert not any(entry.split(" ")[0] == name for entry in listed), out["report"]
        assert out["ids same"]
        assert out["reloadable"] == [False], out["reloadable"]  # tp only
        assert out["suspended"] == [1], out["suspended"]  # the stand-in group's, only


# ---- 8. a group with a CPU leg and an accelerator leg ------------------------------------------


def _mixed(ctx: Rank) -> dict[str, Any]:
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx)
    mixed = dist.new_group([0, 1], backend=f"cpu:gloo,{s.ACCELERATOR}:{leg}", group_desc="mx")
    acc = mixed._get_backend(torch.device(s.ACCELERATOR))

    def cpu_calls() -> dict[str, Any]:
        def reduce() -> Any:
            t = torch.ones(2) * (ctx.rank + 1)
            dist.all_reduce(t, group=mixed)
            return t.tolist()

        def gather() -> Any:
            o = torch.zeros(2)
            dist.all_gather_into_tensor(o, torch.tensor([float(ctx.rank)]), group=mixed)
            return o.tolist()

        def barrier() -> Any:
            dist.barrier(group=mixed)
            return "passed"

        return {
            "all_reduce": suspend_ranks.outcome(reduce),
            "all_gather": suspend_ranks.outcome(gather),
            "barrier": suspend_ranks.outcome(barrier),
        }

    def acc_calls() -> dict[str, Any]:
        def reduce() -> Any:
            t = s.accelerator_tensor(torch.ones(2) * (ctx.rank + 1))
            dist.all_reduce(t, group=mixed)
            return t.host.tolist()

        def gather() -> Any:
            o = s.accelerator_tensor(torch.zeros(2))
            dist.all_gather_into_tensor(
                o, s.accelerator_tensor(torch.tensor([float(ctx.rank)])), group=mixed
            )
            return o.host.tolist()

        def broadcast() -> Any:
            t = s.accelerator_tensor(torch.tensor([float(ctx.rank + 7)]))
            dist.broadcast(t, src=1, group=mixed)
            return t.host.tolist()

        return {
            "all_reduce": suspend_ranks.outcome(reduce),
            "all_gather": suspend_ranks.outcome(gather),
            "broadcast": suspend_ranks.outcome(broadcast),
        }

    out: dict[str, Any] = {"awake": (cpu_calls(), acc_calls())}
    rpg.destroy_process_groups()
    out["acc suspended"] = acc.memory_stats()["suspended"]
    out["asleep"] = (cpu_calls(), acc_calls())
    out["refused by backend"] = [(c.op, c.devices) for c in s.collectives(refused=True)]
    rpg.reload_process_groups()
    out["after"] = (cpu_calls(), acc_calls())
    out["acc after"] = acc.memory_stats()["suspended"]
    return out


MIXED_CPU = {"all_reduce": [3.0, 3.0], "all_gather": [0.0, 1.0], "barrier": "passed"}
MIXED_ACC = {"all_reduce": [3.0, 3.0], "all_gather": [0.0, 1.0], "broadcast": [8.0]}


def test_a_mixed_group_refuses_its_sleeping_accelerator_leg() -> None:
    """``"cpu:gloo,<accelerator>:<stand-in>"``: the accelerator leg sleeps and every call with
    accelerator tensors raises ``GroupSuspendedError`` before it reaches the backend (the
    stand-in refuses nothing); after the reload both legs give torch's numbers. On torch 2.14
    (a pre-hook guards torch's own group; variant B, so the call goes through torch's kernel)
    CPU tensors and the barrier still pass while asleep, on the CPU leg. On torch 2.13 a
    wrapper guards the group and cannot tell legs apart: it refuses every call that
    communicates, CPU tensors and the barrier included (the safe side)."""
    cpu_want = {k: ("ok", v) for k, v in MIXED_CPU.items()}
    acc_want = {k: ("ok", v) for k, v in MIXED_ACC.items()}
    for rank, out in enumerate(suspend_ranks.run_once(_mixed)):
        assert out["awake"] == (cpu_want, acc_want), (rank, out["awake"])
        assert out["after"] == (cpu_want, acc_want), (rank, out["after"])
        assert out["acc suspended"] == 1
        assert out["acc after"] == 0
        cpu, acc = out["asleep"]
        for name, (kind, text) in acc.items():
            assert suspend_ranks.is_suspended_error(kind, text, "mx"), (rank, name, kind, text)
        if suspend_ranks.ON_214:
            assert cpu == cpu_want, (rank, cpu)
        else:
            assert all(suspend_ranks.is_suspended_error(*cpu[name], "mx") for name in cpu), cpu
        assert out["refused by backend"] == [], out["refused by backend"]


# ---- 9. the cycle report ----------------------------------------------------------------------


SIZES = {"tp": (3 * MiB, 1 * MiB), "dp": (5 * MiB, 2 * MiB)}  # (suspend, persist) bytes


def _report(ctx: Rank) -> dict[str, Any]:
    leg = suspend_ranks.leg()
    _, dist, rpg, s = suspend_ranks.start(ctx)
    names = {}
    for desc, (suspend, persist) in SIZES.items():
        s.configure(suspend_bytes=suspend, persist_bytes=persist)
        names[desc] = str(dist.new_group([0, 1], backend=leg, group_desc=desc).group_name)
    s.configure(uninitialized=True, suspend_bytes=7 * MiB)
    names["lazy"] = str(dist.new_group([0, 1], backend=leg, group_desc="lazy").group_name)
    s.configure()
    names["cpu"] = str(dist.new_group([0, 1], backend="gloo").group_name)
    free_before = s.device_memory()[0]
    rpg.destroy_process_groups()
    free_asleep = s.device_memory()[0]
    host_backup = s.host_backup_bytes()
    asleep = rpg.last_cycle_report().to_dict()
    rpg.reload_process_groups()
    return {
        "names": names,
        "measured freed": free_asleep - free_before,
        "host backup": host_backup,
        "back": s.device_memory()[0] == free_before,
        "asleep": asleep,
        "after": rpg.last_cycle_report().to_dict(),
    }


def test_the_cycle_report_gives_what_the_backends_and_the_device_say() -> None:
    """``last_cycle_report().to_dict()["nccl"]``: ``released_bytes`` is the stand-in's
    configured suspend bytes summed over the groups that suspended (not the one only guarded,
    nor the gloo one), ``resident_bytes`` their persistent bytes, the pinned-host estimate the
    host backups the stand-in holds while asleep, ``driver_freed_bytes`` (and ``freed_bytes``)
    what the pretend device gained during the destroy; per group ``stats_before`` /
    ``stats_asleep`` / ``stats_after`` say 0, 1 and 0 suspended, and the calls took time."""
    for rank, out in enumerate(suspend_ranks.run_once(_report)):
        names, after = out["names"], out["after"]
        nccl = after["nccl"]
        released = sum(suspend for suspend, _ in SIZES.values())
        assert out["measured freed"] == released, out["measured freed"]  # the oracle itself
        assert out["back"], "the resume did not give the pretend device its bytes back"
        assert nccl["released_bytes"] == released, (rank, nccl)
        assert nccl["resident_bytes"] == sum(persist for _, persist in SIZES.values())
        assert nccl["pinned_host_bytes_estimate"] == out["host backup"] == released
        assert nccl["driver_freed_bytes"] == after["freed_bytes"] == out["measured freed"]
        assert out["asleep"]["nccl"]["driver_freed_bytes"] == out["measured freed"]
        assert names["cpu"] not in nccl["groups"]
        for desc, (suspend, persist) in SIZES.items():
            group = nccl["groups"][names[desc]]
            want = {"suspend": suspend, "persist": persist, "total": suspend + persist}
            assert group["stats_before"] == {**want, "suspended": 0}, (desc, group)
            assert group["stats_asleep"] == {**want, "suspended": 1}, (desc, group)
            assert group["stats_after"] == {**want, "suspended": 0}, (desc, group)
            assert group["suspend_ms"] > 0, group
            assert group["resume_ms"] > 0, group
        lazy = nccl["groups"].get(names["lazy"])
        assert lazy is None or (lazy["legs"] == [] and lazy["suspend_ms"] == 0), lazy


# ---- 11. memory pools -------------------------------------------------------------------------


def _pools(ctx: Rank) -> dict[str, Any]:
    from reloadpg_autopatch.tools import cpu_nccl as s

    calls: list[tuple[str, int, int]] = []

    def register_mem_pool(self: Any, pool: Any, symm: bool = False) -> None:
        calls.append(("register", id(self), id(pool)))

    def deregister_mem_pool(self: Any, pool: Any) -> None:
        calls.append(("deregister", id(self), id(pool)))

    classes = [s.SuspendableGloo, *([s.SuspendablePy] if s.python_backend_available() else [])]
    for cls in classes:  # before any group exists, as Megatron's allocator would find them
        cls.register_mem_pool = register_mem_pool
        cls.deregister_mem_pool = deregister_mem_pool
    leg = suspend_ranks.leg()
    torch, dist, rpg, _ = suspend_ranks.start(ctx)
    group = dist.new_group([0, 1], backend=leg, group_desc="tp")
    backend = suspend_ranks.backend(group)
    pool = object()
    backend.register_mem_pool(pool, symm=True)
    out: dict[str, Any] = {"at registration": list(calls), "cycles": []}
    for _ in range(3):
        del calls[:]
        rpg.destroy_process_groups()
        destroy = list(calls)
        del calls[:]
        rpg.reload_process_groups()
        out["cycles"].append(
            {
                "destroy": destroy,
                "reload": list(calls),
                "same backend": suspend_ranks.backend(group) is backend,
                "sum": suspend_ranks.rank_sum(dist, torch, ctx.rank, group),
            }
        )
    out["ids"] = (id(backend), id(pool))
    return out


def test_a_registered_memory_pool_is_neither_deregistered_nor_registered_again() -> None:
    """A pool registered through a suspend-mode group's backend stays registered: the
    communicator is suspended, not destroyed, so no destroy deregisters it and no reload
    registers it again; the backend the group hands out is the same object every cycle."""
    for rank, out in enumerate(suspend_ranks.run_once(_pools)):
        backend, pool = out["ids"]
        assert out["at registration"] == [("register", backend, pool)], out["at registration"]
        for n, cycle in enumerate(out["cycles"], start=1):
            assert cycle == {"destroy": [], "reload": [], "same backend": True, "sum": 3.0}, (
                rank,
                n,
                cycle,
            )


# ---- 7. subgroups at four ranks, taken by the rule (as NCCL groups are) -----------------------


def _pairs(ctx: Rank) -> dict[str, Any]:
    """Four ranks, every group taken by the rule (policy ``all``, as the rule takes NCCL
    groups): pairs [0, 1] and [2, 3], so each rank is a non-member of one; three cycles; then
    a group made after the last reload."""
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx, policy="all")
    pairs = [dist.new_group([0, 1], backend=leg), dist.new_group([2, 3], backend=leg)]
    mine = pairs[ctx.rank // 2]
    made = s.creations()
    out: dict[str, Any] = {"sums": [], "asleep": []}
    for _ in range(3):
        rpg.destroy_process_groups()
        out["asleep"].append(
            suspend_ranks.outcome(lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, mine))[0]
        )
        rpg.reload_process_groups()
        out["sums"].append(suspend_ranks.rank_sum(dist, torch, ctx.rank, mine))
    out["creations"] = s.creations() - made
    fresh = dist.new_group([0, 1, 2, 3], backend=leg)
    names: list[Any] = [None] * 4
    dist.all_gather_object(names, str(fresh.group_name))  # on gloo WORLD
    out["fresh names"] = names
    out["fresh sum"] = suspend_ranks.rank_sum(dist, torch, ctx.rank, fresh)
    return out


def test_non_members_create_nothing_for_groups_that_sleep_by_suspend() -> None:
    """Each rank is a non-member of one pair: no rank creates any group over three cycles
    (the stand-in's creator is never called; a non-member creating alone would hang, or give
    torch's group counter a step its peers never took), each pair sums 1+2 and 3+4, and a
    group made afterwards has the same name on every rank and works."""
    for rank, out in enumerate(suspend_ranks.run_once(_pairs, 4, timeout=240)):
        assert out["asleep"] == ["GroupSuspendedError"] * 3, (rank, out["asleep"])
        assert out["sums"] == [3.0 if rank < 2 else 7.0] * 3, (rank, out["sums"])
        assert out["creations"] == 0, (rank, out["creations"])
        assert len(set(out["fresh names"])) == 1, out["fresh names"]
        assert out["fresh sum"] == 10.0, (rank, out["fresh sum"])
