"""WORLD through the cycle: the backend, timeout and name it comes back with, read from torch."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.support.ranks import Rank, run_ranks

pytestmark = pytest.mark.timeout(240)

MINUTES_77 = timedelta(minutes=77)


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


def test_world_registered_after_a_group_is_still_the_first_record() -> None:
    """WORLD is the first record wherever its registration comes: destroy's hooks get it first,
    and its swap (last in a destroy, first in a reload) leaves the earlier group working."""
    for report in run_ranks(_registered_after_a_group, 2, env={"SLIME_RELOADABLE_PG": "1"}):
        assert report["first"] == "WORLD (ranks [0, 1])"
        assert report["hooked_first"]
        assert report["sum"] == 2.0
