"""Suspend mode (issue 23): communicators sleep in place, every object stays, nothing is made.

``SLIME_RELOADABLE_PG_MODE=suspend`` (or ``set_reload_mode("suspend")``) makes
``destroy_process_groups()`` call each suspendable backend's ``suspend()`` and
``reload_process_groups()`` its ``resume()``, guarding every sleeping group in between. Here:
every path into torch's dispatcher is refused while asleep (WORLD and ``new_group`` on its
backend too) and works after; every object and map entry stays and nothing is created, for
members and non-members alike; gloo groups and a gloo WORLD stay awake and untouched, and a
mixed group refuses only its sleeping accelerator leg; a sleeping group still answers its local
calls; the suspends and resumes run in creation order, WORLD first; on torch 2.14 every group
stays torch's own object. The other suspend files: ``test_suspend_store`` (store traffic),
``test_suspend_refusals`` (what suspend refuses, and the agreement), ``test_suspend_memory``
(preflight, report, pools), ``test_suspend_steps`` (failures, releases, fork, threads),
``test_suspend_nccl2`` (torch 2.15's nccl2) and ``test_suspend_cpu_model`` (the stand-in
itself); the watchdog is ``test_faults_watchdog``.

No GPU exists here, so the backend is the stand-in of ``reloadpg_autopatch/tools/cpu_nccl``
(NCCL's protocol on gloo; ``docs/suspend-facts.md``): variant A (``"suspendable"``, both lanes)
and, on torch 2.14, variant B (``"suspendable_py"``), which also receives every collective in
Python and logs it. Every case runs on gloo ranks that the gate alone activated
(``tests/support/suspend_ranks.py``, whose ``run_once`` lets several tests read one run). The
oracles are outside the package: torch's own results and objects (``id()``, ``_world``'s maps,
``dist.group.WORLD``), the stand-in's call log (what reached the backend, in which order, in
which state), its creation count, and the exception each call raises.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.support import suspend_ranks
from tests.support.ranks import Rank

pytestmark = pytest.mark.timeout(300)

# ---- every dispatcher path refused while asleep, and working after --------------------------


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
    2.15's nccl2 does so at creation, where no pre-hook sees it;
    ``tests/ranks/test_suspend_nccl2.py`` shows the split); a gloo group is made and works at
    once; WORLD stays refused."""
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


# ---- identity: the same objects, the same maps, nothing created ----------------------------


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


# ---- gloo groups and a gloo WORLD stay awake, untouched ---------------------------------------


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


# ---- a group with a CPU leg and an accelerator leg ------------------------------------------


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


# ---- subgroups at four ranks, taken by the rule (as NCCL groups are) -----------------------


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


# ---- the local calls of a sleeping group ("still answers the local ones (rank(), size(),
# group_name)") ---------------------------------------------------------------------------------


def _local_calls(ctx: Rank) -> dict[str, Any]:
    leg = suspend_ranks.leg()
    torch, dist, rpg, _s = suspend_ranks.start(ctx)
    group = dist.new_group([0, 1], backend=leg, group_desc="tp")

    def local() -> dict[str, Any]:
        return {
            "rank": suspend_ranks.outcome(group.rank),
            "size": suspend_ranks.outcome(group.size),
            "group_name": suspend_ranks.outcome(lambda: str(group.group_name)),
        }

    awake = local()
    rpg.destroy_process_groups()
    asleep = local()
    refused = suspend_ranks.outcome(lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, group))
    rpg.reload_process_groups()
    return {"awake": awake, "asleep": asleep, "refused": refused}


def test_a_sleeping_group_still_answers_rank_size_and_its_name() -> None:
    for rank, out in enumerate(suspend_ranks.run_once(_local_calls)):
        assert out["awake"]["rank"] == ("ok", rank), out
        assert out["awake"]["size"] == ("ok", 2), out
        assert out["asleep"] == out["awake"], (rank, out)
        kind, text = out["refused"]
        assert kind == "GroupSuspendedError", (rank, out)
        # It names the group, the operation and what to call.
        assert "'tp'" in text, text
        assert "is suspended (" in text, text  # "(<the operation>)"
        # The pre-hook names torch's op (ALLREDUCE); on 2.13 the wrapper names the function.
        assert "allreduce" in text.lower().replace("_", ""), text
        assert "reload_process_groups()" in text, text


# ---- the order of the suspends and resumes ("in creation order (WORLD first)", the same on
# every rank: each is collective inside NCCL) ----------------------------------------------------


def _order(ctx: Rank) -> dict[str, Any]:
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx, world=leg, register=True)
    groups = [dist.group.WORLD] + [
        dist.new_group([0, 1], backend=leg, group_desc=d) for d in ("tp", "dp", "pp")
    ]
    labels = [suspend_ranks.backend(g).label for g in groups]
    seen = len(s.CALLS)
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    calls = [(c.backend, c.op) for c in s.CALLS[seen:] if c.op in ("suspend", "resume")]
    report = rpg.last_cycle_report().to_dict()
    return {
        "labels": labels,
        "names": [str(g.group_name) for g in groups],
        "suspended": report["destroy"]["groups"].get("suspended"),
        "resumed": report["reload"]["groups"].get("resumed"),
        "suspends": [b for b, op in calls if op == "suspend"],
        "resumes": [b for b, op in calls if op == "resume"],
        "sums": [suspend_ranks.rank_sum(dist, torch, ctx.rank, g) for g in groups],
    }


def test_suspends_and_resumes_run_in_creation_order_world_first() -> None:
    for rank, out in enumerate(suspend_ranks.run_once(_order)):
        assert out["suspends"] == out["labels"], (rank, out)
        assert out["resumes"] == out["labels"], (rank, out)
        # The report lists them alike: suspended at the destroy, resumed at the reload.
        assert out["suspended"] == out["resumed"] == out["names"], (rank, out)
        assert out["sums"] == [3.0] * 4, (rank, out["sums"])


# ---- torch 2.14: no wrapper at all ("in suspend mode on 2.14 no collective is wrapped";
# "dist.group.WORLD is torch's own object for the whole run") -----------------------------------


def _types(ctx: Rank) -> dict[str, Any]:
    leg = suspend_ranks.leg()
    torch, dist, rpg, _s = suspend_ranks.start(ctx, world=leg, register=True)
    groups = {
        "WORLD": dist.group.WORLD,
        "tp": dist.new_group([0, 1], backend=leg, group_desc="tp"),
    }

    def kinds() -> dict[str, str]:
        return {
            **{name: type(g).__name__ for name, g in groups.items()},
            "dist.group.WORLD": type(dist.group.WORLD).__name__,
        }

    out = {"awake": kinds()}
    rpg.destroy_process_groups()
    out["asleep"] = kinds()
    rpg.reload_process_groups()
    out["after"] = kinds()
    out["sums"] = [suspend_ranks.rank_sum(dist, torch, ctx.rank, g) for g in groups.values()]
    return out


@suspend_ranks.needs_b
def test_on_torch_2_14_every_group_stays_torch_own_object() -> None:
    for rank, out in enumerate(suspend_ranks.run_once(_types)):
        for when in ("awake", "asleep", "after"):
            assert set(out[when].values()) == {"ProcessGroup"}, (rank, when, out[when])
        assert out["sums"] == [3.0, 3.0], (rank, out["sums"])
