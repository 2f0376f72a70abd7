"""WORLD through the cycle: what it comes back with, and that it stays one object.

WORLD comes back with its backend, timeout, name, bound device and options; its accelerator
backends come from torch's registrations; ranks wait for each other up to WORLD's own timeout;
registered after a group, it is still the first record; its name resolves to WORLD and a timeout
set later comes back; it is one object for the life of the world, so a compiled step never
recompiles. Read from torch: its backend's options, ``_resolve_process_group``, object
identity, Dynamo's frame counters.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from tests.support import registered_world, run_events, this_tree
from tests.support.ranks import GATE, HOST, Rank, run_ranks, total

if TYPE_CHECKING:  # only a type checker sees it: the probes of the rule test name it as text
    pass

pytestmark = pytest.mark.timeout(300)

MINUTES_77 = timedelta(minutes=77)


# ---- backend, timeout and name; the first record -------------------------------------------------


def _cpu_timeout(group) -> timedelta:
    import torch

    return group._get_backend(torch.device("cpu")).options._timeout


def _swap(ctx: Rank) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch as rpg

    rpg.monkey_patch_torch_dist()
    from reloadpg_autopatch.tools.launch import init_rank

    init_rank(ctx, timeout=30.0)
    # WORLD with a timeout of its own, then registered without one: it must keep 77 minutes.
    dist.destroy_process_group()
    ctx.reinit("again/", MINUTES_77)
    calls = []
    real_init = dist.init_process_group

    def spy(*args, **kwargs):  # torch's own init, with a note of what it was asked for
        calls.append((kwargs.get("backend", args[0] if args else None), kwargs.get("timeout")))
        return real_init(*args, **kwargs)

    dist.init_process_group = spy
    # "cpu:gloo" is a real backend string torch accepts, and tells the two WORLDs apart.
    rpg.register_default_process_group(accelerator_backends=("gloo",), temporary_backend="cpu:gloo")
    group = dist.new_group([0, 1])
    names = {"world": c10d._get_default_group().group_name, "group": group.group_name}
    out = {"cycles": []}
    for _ in range(2):
        rpg.destroy_process_groups()
        asleep = {
            "timeout": _cpu_timeout(dist.group.WORLD),
            "config": str(dist.get_backend_config()),
        }
        t = torch.ones(1)
        dist.all_reduce(t)  # the temporary WORLD works
        rpg.reload_process_groups()
        fresh = dist.new_group([0, 1])  # must not take a live group's name
        t2 = torch.ones(1)
        dist.all_reduce(t2, group=group)
        out["cycles"].append(
            {
                "asleep": asleep,
                "asleep_sum": t.item(),
                "timeout": _cpu_timeout(dist.group.WORLD),
                "config": str(dist.get_backend_config()),
                "names": {
                    "world": c10d._get_default_group().group_name,
                    "group": group.group_name,
                },
                "fresh_name": fresh.group_name,
                "group_sum": t2.item(),
            }
        )
    out["names"] = names
    out["calls"] = [(str(b), t) for b, t in calls]
    return out


@pytest.mark.timeout(240)
def test_world_comes_back_with_its_backend_timeout_and_name() -> None:
    for report in run_ranks(_swap, 2):
        names = report["names"]
        fresh = set()
        for cycle in report["cycles"]:
            assert cycle["asleep"]["timeout"] == MINUTES_77
            assert cycle["asleep"]["config"] == "cpu:gloo"  # the temporary backend, as asked
            assert cycle["asleep_sum"] == 2.0
            assert cycle["timeout"] == MINUTES_77
            assert cycle["config"] == "cpu:gloo,cuda:gloo"  # torch's config for plain "gloo"
            assert cycle["names"] == names
            assert cycle["fresh_name"] not in names.values()
            fresh.add(cycle["fresh_name"])
            assert cycle["group_sum"] == 2.0
        assert len(fresh) == 2
        # destroy: the temporary backend; reload: the original one; both with 77 minutes
        assert report["calls"] == [("cpu:gloo", MINUTES_77), ("gloo", MINUTES_77)] * 2


def _derived(ctx: Rank) -> dict:
    import torch.distributed as dist

    from reloadpg_autopatch.groups.backends import holds_accelerator_memory

    def creator(*args):  # never called: only the registration's device list matters
        raise AssertionError("not created in this test")

    # Real torch registrations, as a plugin or torch 2.14's nccl2 would make them.
    dist.Backend.register_backend("acceltest", creator, devices=["cuda"])
    dist.Backend.register_backend("cputest", creator, devices=["cpu", "cuda"])
    return {
        name: holds_accelerator_memory(name)
        for name in ("nccl", "xccl", "gloo", "ucc", "mpi", "acceltest", "cputest")
    } | {"cpu:gloo,cuda:nccl": holds_accelerator_memory("cpu:gloo,cuda:nccl")}


@pytest.mark.timeout(240)
def test_accelerator_backends_come_from_torchs_registrations() -> None:
    (report,) = run_ranks(_derived, 1)
    assert report == {
        "nccl": True,
        "xccl": True,
        "gloo": False,
        "ucc": False,
        "mpi": False,
        "acceltest": True,
        "cputest": False,
        "cpu:gloo,cuda:nccl": True,
    }


def _peer_never_reloads(ctx: Rank) -> Any:
    import time

    import reloadpg_autopatch as rpg

    dist = ctx.patched()
    dist.destroy_process_group()
    ctx.reinit("short/", timedelta(seconds=3))
    rpg.register_default_process_group()  # no timeout given: WORLD's own 3 s, not torch's 30 min
    dist.new_group([0, 1])
    rpg.destroy_process_groups()
    if ctx.rank == 1:
        return None  # the peer never reaches reload
    started = time.monotonic()
    try:
        rpg.reload_process_groups()
    except RuntimeError as error:
        return str(error), time.monotonic() - started
    return "reloaded without its peer", time.monotonic() - started


@pytest.mark.timeout(240)
def test_ranks_wait_for_each_other_up_to_worlds_own_timeout() -> None:
    """Registered without a timeout, WORLD keeps the one it has: a reload whose peer never
    comes fails after WORLD's 3 s, not after torch's default 30 min, naming the missing rank."""
    error, waited = run_ranks(_peer_never_reloads, 2, timeout=40)[0]
    assert "ranks 1" in error, error
    assert 2.5 <= waited < 20, waited


def _registered_after_a_group(ctx: Rank) -> dict:
    import torch

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.groups import destroy, process, registry

    dist = ctx.begin()
    group = dist.new_group([0, 1])  # made before WORLD is registered
    rpg.register_default_process_group(accelerator_backends=("gloo",))
    first = registry.records()[0]
    hooked = destroy.concerned(process.current())
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    t = torch.ones(1)
    dist.all_reduce(t, group=group)
    return {
        "first": first.way.describe(first, [0, 1]),
        "hooked_first": hooked[0] is dist.group.WORLD,
        "sum": t.item(),
    }


@pytest.mark.timeout(240)
def test_world_registered_after_a_group_is_still_the_first_record() -> None:
    """WORLD is the first record wherever its registration comes: destroy's hooks get it first,
    and its swap (last in a destroy, first in a reload) leaves the earlier group working."""
    for report in run_ranks(_registered_after_a_group, 2, env={"SLIME_RELOADABLE_PG": "1"}):
        assert report["first"] == "WORLD (ranks [0, 1])"
        assert report["hooked_first"]
        assert report["sum"] == 2.0


# ---- WORLD's name, and its timeout after swaps ---------------------------------------------------


def _native_of(group: Any) -> Any:
    import torch.distributed as dist

    inner = getattr(group, "group", None)
    return inner if isinstance(inner, dist.ProcessGroup) else group


def _world_name(ctx: Rank) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch as rpg

    registered_world.start(ctx)
    rpg.destroy_process_groups()
    rpg.reload_process_groups()  # WORLD swapped out and back once
    name = dist.group.WORLD.group_name
    resolved = c10d._resolve_process_group(name)
    later = timedelta(minutes=41)
    if hasattr(c10d, "set_timeout"):
        c10d.set_timeout(later, group=None)
    else:
        c10d._set_pg_timeout(later, group=None)
    cycles = []
    for _ in range(2):
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        t = torch.tensor([ctx.rank + 1.0])
        dist.all_reduce(t, group=resolved)
        world = dist.group.WORLD
        native = _native_of(c10d._get_default_group())
        cycles.append(
            {
                "sum": t.item(),
                "same_as_world": resolved is world,
                "resolves_to_world": c10d._resolve_process_group(name) is world,
                "name": world.group_name == name,
                "timeout": native._get_backend(torch.device("cpu")).options._timeout,
            }
        )
    return {"cycles": cycles}


def test_worlds_name_resolves_to_world_and_a_later_timeout_comes_back() -> None:
    for report in run_ranks(_world_name, 2, env=GATE, timeout=200):
        for cycle in report["cycles"]:
            assert cycle["sum"] == 3.0
            assert cycle["same_as_world"]
            assert cycle["resolves_to_world"]
            assert cycle["name"]
            assert cycle["timeout"] == timedelta(minutes=41)


# ---- WORLD comes back with its bound device and options ------------------------------------------


#: A backend torch registers for no CPU device, as it does NCCL: a Python subclass of gloo's
#: backend (the collectives stay gloo's) that keeps the options it was created with.
FAKE_ACCELERATOR = "promisesacc"


def _world_device_and_options(ctx: Rank) -> dict:
    import warnings

    import torch
    import torch.distributed as dist

    warnings.simplefilter("ignore", FutureWarning)
    rpg = this_tree.package()
    assert rpg.is_patched()
    rpg.set_wrap_policy("all")
    keep = []  # torch 2.13 forgets a Python backend object that nobody references

    class Accelerator(dist.ProcessGroupGloo):
        def __init__(self, store: Any, rank: int, size: int, timeout: Any, given: Any) -> None:
            super().__init__(store, rank, size, timeout)
            self.given = given

        @property
        def options(self) -> Any:  # as NCCL's backend returns its Options
            return self.given

        @property
        def supports_splitting(self) -> bool:
            return False

    def create(common: Any, backend_options: Any) -> Any:
        backend = Accelerator(
            common.store, common.group_rank, common.group_size, common.timeout, backend_options
        )
        keep.append(backend)
        return backend

    dist.Backend.register_backend(FAKE_ACCELERATOR, create, extended_api=True, devices=["cuda"])
    options = dist.ProcessGroupGloo._Options()
    options._timeout = this_tree.TIMEOUT
    store = dist.TCPStore(
        HOST, ctx.port, ctx.world_size, is_master=False, timeout=this_tree.TIMEOUT
    )
    dist.init_process_group(
        f"cpu:gloo,cuda:{FAKE_ACCELERATOR}",
        store=store,
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=this_tree.TIMEOUT,
        pg_options=options,
    )
    # init_process_group(device_id=cuda:N) binds the device; a CPU build refuses a CUDA device,
    # so it is bound as torch binds it, on the group.
    device = torch.device("cuda", 0)
    dist.group.WORLD.bound_device_id = device
    rpg.register_default_process_group()  # swapped: its backend serves no CPU device
    real = dist.init_process_group
    received: list[dict[str, Any]] = []

    def spy(*args: Any, **kwargs: Any) -> None:
        received.append({"args": args, **kwargs})
        given = kwargs.pop("device_id", None)  # what torch on a GPU would bind
        real(*args, **kwargs)
        if given is not None:
            from torch.distributed import distributed_c10d as c10d

            c10d._world.default_pg.bound_device_id = given

    dist.init_process_group = spy
    try:
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
    finally:
        dist.init_process_group = real

    def backend_of(call: dict[str, Any]) -> Any:
        return call.get("backend", call["args"][0] if call["args"] else None)

    restores = [c for c in received if backend_of(c) == f"cpu:gloo,cuda:{FAKE_ACCELERATOR}"]
    return {
        "calls": len(received),
        "restores": [
            {
                "device_id": str(c.get("device_id")),
                "pg_options_is_registered": c.get("pg_options") is options,
            }
            for c in restores
        ],
        "bound_after": str(dist.group.WORLD.bound_device_id),
        "world_type": type(dist.group.WORLD).__name__,
    }


def test_p8_world_comes_back_with_its_bound_device_and_options() -> None:
    reports = run_ranks(_world_device_and_options, 2, timeout=150, env=GATE)
    for report in reports:
        assert report["calls"] == 2, report  # the temporary WORLD, then WORLD again
        assert report["restores"] == [{"device_id": "cuda:0", "pg_options_is_registered": True}], (
            report
        )
        assert report["bound_after"] == "cuda:0", report


# ---- one WORLD for the life of the world ---------------------------------------------------------


def _world_identity(ctx: Rank, mode: str) -> dict:
    import torch
    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch as rpg

    dist = run_events.begin(ctx, registered=True)
    saved = dist.group.WORLD
    pair = dist.new_group([0, 1])
    peer = 1 - ctx.rank
    outgoing, incoming = torch.tensor([10.0 + ctx.rank]), torch.zeros(1)
    ops = [
        dist.P2POp(dist.isend, outgoing, peer, pair),
        dist.P2POp(dist.irecv, incoming, peer, pair),
    ]
    created = []
    helper = c10d._new_process_group_helper

    def counting(*args: Any, **kwargs: Any) -> Any:  # every native group torch builds
        created.append(1)
        return helper(*args, **kwargs)

    c10d._new_process_group_helper = counting
    cycles = []
    for _ in range(3):
        before = len(created)
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        incoming.zero_()
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        # torch's own loops over its map see only the native groups it holds now.
        live = [any(pg is op.group for pg in c10d._world.pg_map) for op in ops]
        cycles.append(
            {
                "same": [
                    dist.group.WORLD is saved,
                    dist.GroupMember.WORLD is saved,
                    c10d._get_default_group() is saved,
                ],
                "rank": dist.get_rank(saved),
                "size": dist.get_world_size(saved),
                "sum": total(saved, ctx.rank + 1),
                "p2p": incoming.item(),
                "p2p_on_live_group": live,
                "created": len(created) - before,
            }
        )
        dist.barrier(group=saved)
    return {"cycles": cycles, "rank": ctx.rank, "in_place": type(pair) is dist.ProcessGroup}


@pytest.mark.parametrize("mode", ["wrapper", "auto", "native"])
def test_world_is_one_object_for_the_life_of_the_world(mode: str) -> None:
    if mode == "native" and not run_events.reconfigures():
        pytest.skip("native mode needs torch 2.14's ProcessGroup.reconfigure")
    reports = run_ranks(
        functools.partial(_world_identity, mode=mode),
        2,
        env={**GATE, "SLIME_RELOADABLE_PG_MODE": mode},
    )
    for report in reports:
        for cycle in report["cycles"]:
            assert cycle["same"] == [True, True, True], cycle
            assert cycle["rank"] == report["rank"]
            assert cycle["size"] == 2
            assert cycle["sum"] == 3.0
            assert cycle["p2p"] == 10.0 + (1 - report["rank"]), cycle
            assert cycle["p2p_on_live_group"] == [True, True], cycle
            # WORLD really went through the cycle: torch built its communicators again
            # (the temporary and the restored WORLD and the pair; in place: none).
            assert cycle["created"] == (0 if report["in_place"] else 3), cycle


CYCLES = 20


def _compiled_world(ctx: Rank) -> dict:
    import torch
    from torch._dynamo.utils import counters
    from torch.distributed import _functional_collectives as funcol

    import reloadpg_autopatch as rpg

    dist = run_events.begin(ctx, registered=True)

    def step(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        dist.all_reduce(y)  # no group: WORLD
        return funcol.all_reduce(y, "sum", dist.group.WORLD)

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    values = [compiled(torch.ones(1)).item()]
    frames_after_first = counters["frames"]["ok"]
    for _ in range(CYCLES):
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        values.append(compiled(torch.ones(1)).item())
    return {
        "values": values,
        "compiles_first": frames_after_first,
        "compiles_total": counters["frames"]["ok"],
        "recompiles": counters["recompiles"] and dict(counters["recompiles"]),
    }


def test_a_compiled_step_with_world_never_recompiles_across_cycles() -> None:
    """Dynamo guards on WORLD's identity: one object means one compilation for 20 cycles
    (at its default recompile limit of 8, a new WORLD per cycle fails under fullgraph)."""
    for report in run_ranks(_compiled_world, 2, timeout=280, env=GATE):
        assert report["values"] == [8.0] * (CYCLES + 1)
        assert report["compiles_total"] == report["compiles_first"], report
