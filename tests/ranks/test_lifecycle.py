"""The lifecycle's basics: destroy and reload subgroups and WORLD, on real gloo ranks.

Three cycles free and rebuild every subgroup, and swap WORLD out and restore it; a destroyed
group raises a clear error at once; dropped and released groups are not rebuilt; bad input
before ``init_process_group`` and the lifecycle's edge cases get clear errors; the wrap policy
(slime's by default, configurable) decides which groups are wrapped: single-rank accelerator
groups stay torch's own, and ``none`` only unwraps, in every mode (on the stand-in of
``reloadpg_autopatch/tools/cpu_nccl``, registered for an accelerator only: no GPU here).

The oracles are torch's: hand-computed collective results, ``_world.pg_map``, the group types
torch hands out, the stand-in's call log and the exceptions raised.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support import accelerator
from tests.support.ranks import Rank, errors_of, pg_count, run_ranks

pytestmark = pytest.mark.timeout(240)


def _check_groups(dist, groups: dict, rank: int) -> dict:
    """One all_reduce per group: the sum of global ranks of its members."""
    import torch

    sums = {}
    for name, group in groups.items():
        if not isinstance(group, dist.ProcessGroup):
            continue
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=group)
        sums[name] = t.item()
    return sums


def _expected_sums(rank: int) -> dict:
    tp = [0 + 1, 0 + 1, 2 + 3, 2 + 3][rank]
    dp = [0 + 2, 1 + 3, 0 + 2, 1 + 3][rank]
    enum = [0 + 3, 1 + 2, 1 + 2, 0 + 3][rank]
    return {"tp": tp, "dp": dp, "sub": tp, "enum": enum, "single": rank, "all": 6}


def _make_groups(dist, rank: int) -> dict:
    tp = [dist.new_group(r) for r in ([0, 1], [2, 3])][rank // 2]
    dp = [dist.new_group(r) for r in ([0, 2], [1, 3])][rank % 2]
    sub, _ = dist.new_subgroups(2)
    enum, _ = dist.new_subgroups_by_enumeration([[0, 3], [1, 2]])
    single = [dist.new_group([r]) for r in range(4)][rank]
    everyone = dist.new_group()
    return {"tp": tp, "dp": dp, "sub": sub, "enum": enum, "single": single, "all": everyone}


def _subgroup_cycles(ctx: Rank) -> dict:
    import reloadpg_autopatch
    from reloadpg_autopatch.groups import registry

    dist = ctx.patched()
    groups = _make_groups(dist, ctx.rank)
    assert all(isinstance(g, reloadpg_autopatch.ReloadableProcessGroup) for g in groups.values())
    records = len(registry.records())
    live_count = pg_count()
    report = {"cycles": [], "records": records, "pg_before": live_count}
    for _ in range(3):
        sums = _check_groups(dist, groups, ctx.rank)
        reloadpg_autopatch.destroy_process_groups()
        reloadpg_autopatch.destroy_process_groups()  # idempotent
        after_destroy = pg_count()
        destroyed = all(g.group is None for g in groups.values())
        reloadpg_autopatch.reload_process_groups()
        reloadpg_autopatch.reload_process_groups()  # idempotent
        report["cycles"].append(
            {
                "sums_before": sums,
                "pg_after_destroy": after_destroy,
                "all_destroyed": destroyed,
                "pg_after_reload": pg_count(),
                "records": len(registry.records()),
            }
        )
    report["sums_final"] = _check_groups(dist, groups, ctx.rank)
    return report


def test_three_subgroup_cycles_free_and_rebuild_everything() -> None:
    for rank, report in enumerate(run_ranks(_subgroup_cycles, 4)):
        want = _expected_sums(rank)
        assert report["pg_before"] > 1
        for cycle in report["cycles"]:
            assert cycle["sums_before"] == want
            assert cycle["all_destroyed"]
            assert cycle["pg_after_destroy"] == 1  # only WORLD is left in torch's map
            assert cycle["pg_after_reload"] == report["pg_before"]
            assert cycle["records"] == report["records"]
        assert report["sums_final"] == want


def _world_cycles(ctx: Rank) -> dict:
    import torch

    import reloadpg_autopatch

    dist = ctx.patched("auto")
    original_world = dist.GroupMember.WORLD
    # gloo plays the accelerator here: that is what the parameter is for.
    reloadpg_autopatch.register_default_process_group(accelerator_backends=("gloo",))
    groups = _make_groups(dist, ctx.rank)
    report = {
        "cycles": [],
        "wrapped": sorted(
            n for n, g in groups.items() if isinstance(g, reloadpg_autopatch.ReloadableProcessGroup)
        ),
    }
    from torch.distributed import distributed_c10d as c10d

    built = []
    helper = c10d._new_process_group_helper

    def counting(*args, **kwargs):  # the native groups torch builds, this rank a member
        result = helper(*args, **kwargs)
        built.extend([1] if isinstance(result[0], c10d.ProcessGroup) else [])
        return result

    c10d._new_process_group_helper = counting
    for _ in range(3):
        sums = _check_groups(dist, groups, ctx.rank)
        before = len(built)
        reloadpg_autopatch.destroy_process_groups()
        # torch's own view: the one native group its map holds now serves as WORLD.
        (asleep_world,) = list(c10d._world.pg_map)
        t = torch.tensor([1.0])
        dist.all_reduce(t)  # the temporary WORLD works while the groups sleep
        asleep = {
            "temporary_is_new": asleep_world is not original_world,
            "world_sum": t.item(),
            "pg_count": pg_count(),
            "built": len(built) - before,
        }
        before = len(built)
        reloadpg_autopatch.reload_process_groups()
        t = torch.tensor([float(ctx.rank)])
        dist.all_reduce(t)
        report["cycles"].append(
            {
                "sums": sums,
                "asleep": asleep,
                "built": len(built) - before,
                "world_sum_after": t.item(),
                "backend": str(dist.get_backend()),
                "suite_ok": _check_groups(dist, groups, ctx.rank),
            }
        )
    return report


def test_three_world_cycles_swap_world_and_restore_it() -> None:
    for rank, report in enumerate(run_ranks(_world_cycles, 4)):
        want = _expected_sums(rank)
        # With WORLD registered, the default policy wraps gloo and single-rank groups too.
        assert report["wrapped"] == sorted(want)
        for cycle in report["cycles"]:
            assert cycle["sums"] == want
            assert cycle["asleep"]["temporary_is_new"]
            assert cycle["asleep"]["world_sum"] == 4.0
            assert cycle["asleep"]["pg_count"] == 1  # the temporary WORLD alone
            assert cycle["asleep"]["built"] == 1  # the temporary WORLD
            assert cycle["built"] == 1 + len(want)  # WORLD and this rank's groups
            assert cycle["world_sum_after"] == 6.0
            assert cycle["backend"] == "gloo"
            assert cycle["suite_ok"] == want


def _destroyed_use(ctx: Rank) -> dict:
    import torch

    import reloadpg_autopatch

    dist = ctx.patched()
    group = dist.new_group([0, 1])
    reloadpg_autopatch.destroy_process_groups()
    flags = [group.is_destroyed]
    started = time.monotonic()
    errors = errors_of(
        {
            "all_reduce": lambda: dist.all_reduce(torch.ones(1), group=group),
            "get_rank": lambda: dist.get_rank(group),
            "method": lambda: group.allreduce([torch.ones(1)]),
            "property": lambda: group.group_name,
            "unpatched": lambda: reloadpg_autopatch._originals.original("all_reduce")(
                torch.ones(1), group=group
            ),
        }
    )
    elapsed = time.monotonic() - started
    reloadpg_autopatch.reload_process_groups()
    t = torch.ones(1)
    dist.all_reduce(t, group=group)
    flags.append(group.is_destroyed)
    return {
        "errors": errors,
        "elapsed": elapsed,
        "after_reload": t.item(),
        "repr": repr(group),
        "is_destroyed": flags,
        "group_info_ranks": group.group_info["ranks"],
    }


def test_using_a_destroyed_group_raises_a_clear_error_at_once() -> None:
    for report in run_ranks(_destroyed_use, 2):
        assert report["elapsed"] < 5.0  # no collective was attempted: nothing can hang
        for message in report["errors"].values():
            assert "ReloadableProcessGroup (ranks [0, 1]) is destroyed" in message
            assert "reload_process_groups()" in message
        assert report["after_reload"] == 2.0
        assert "live" in report["repr"]
        assert report["is_destroyed"] == [True, False]  # slime's property, both ways
        assert report["group_info_ranks"] == [0, 1]


def _dropped_and_released(ctx: Rank) -> dict:
    import gc

    import torch

    import reloadpg_autopatch
    from reloadpg_autopatch.groups import registry

    dist = ctx.patched()
    keep = dist.new_group([0, 1])
    dropped = dist.new_group([0, 1])
    released = dist.new_group([0, 1])
    records = len(registry.records())
    base = pg_count()
    del dropped
    gc.collect()
    dist.destroy_process_group(released)  # released for good
    after_release = pg_count()
    released_error = ""
    try:
        dist.barrier(group=released)
    except RuntimeError as error:
        released_error = str(error)
    reloadpg_autopatch.destroy_process_groups()
    after_destroy = pg_count()
    reloadpg_autopatch.reload_process_groups()
    t = torch.ones(1)
    dist.all_reduce(t, group=keep)
    return {
        "base": base,
        "after_release": after_release,
        "after_destroy": after_destroy,
        "after_reload": pg_count(),
        "records": (records, len(registry.records())),
        "live": len(reloadpg_autopatch.reloadable_groups()),
        "released_error": released_error,
        "released_still_destroyed": released.group is None,
        "sum": t.item(),
    }


def test_dropped_and_released_groups_are_not_rebuilt() -> None:
    for report in run_ranks(_dropped_and_released, 2):
        assert report["after_release"] == report["base"] - 1
        assert report["after_destroy"] == 1  # the dropped group's communicator went too
        assert report["after_reload"] == 2  # WORLD and the one group still held
        assert report["records"] == (3, 1)  # every rank let go of two: both forgotten
        assert report["live"] == 1
        assert "released with torch.distributed.destroy_process_group()" in report["released_error"]
        assert report["released_still_destroyed"]
        assert report["sum"] == 2.0


def _policies(ctx: Rank) -> dict:
    import reloadpg_autopatch

    dist = ctx.patched("auto")
    kinds = {}
    kinds["gloo pair"] = type(dist.new_group([0, 1])).__name__
    kinds["single"] = type([dist.new_group([r]) for r in range(2)][ctx.rank]).__name__
    reloadpg_autopatch.set_wrap_policy(lambda spec: spec.ranks == (0, 1))
    kinds["callable pair"] = type(dist.new_group([0, 1])).__name__
    kinds["callable single"] = type([dist.new_group([r]) for r in range(2)][ctx.rank]).__name__
    reloadpg_autopatch.set_wrap_policy("none")
    kinds["none"] = type(dist.new_group([0, 1])).__name__
    reloadpg_autopatch.set_wrap_policy("auto")
    reloadpg_autopatch.register_default_process_group()
    kinds["registered gloo pair"] = type(dist.new_group([0, 1])).__name__
    return kinds


def test_group_policy_defaults_to_slimes_and_is_configurable() -> None:
    for kinds in run_ranks(_policies, 2):
        assert kinds == {
            "gloo pair": "ProcessGroup",
            "single": "ProcessGroup",
            "callable pair": "ReloadableProcessGroup",
            "callable single": "ProcessGroup",
            "none": "ProcessGroup",
            "registered gloo pair": "ReloadableProcessGroup",
        }


def _before_init(ctx: Rank) -> dict:
    import reloadpg_autopatch

    reloadpg_autopatch.monkey_patch_torch_dist()
    errors = {}
    for label, call in {
        "reload": reloadpg_autopatch.reload_process_groups,
        "register": reloadpg_autopatch.register_default_process_group,
        "timeout": lambda: reloadpg_autopatch.register_default_process_group(30),
        "backends": lambda: reloadpg_autopatch.register_default_process_group(
            accelerator_backends=[None]
        ),
    }.items():
        try:
            call()
            errors[label] = "no error"
        except Exception as error:
            # The package's own errors are RuntimeError subclasses (ReloadPGError): named so.
            kind = "RuntimeError" if isinstance(error, RuntimeError) else type(error).__name__
            errors[label] = f"{kind}: {error}"
    reloadpg_autopatch.destroy_process_groups()  # nothing to destroy: a no-op, not an error
    return errors


def test_bad_input_before_init_gets_clear_errors() -> None:
    (errors,) = run_ranks(_before_init, 1)
    assert errors["reload"].startswith("RuntimeError: reload_process_groups() needs")
    assert "init_process_group() first" in errors["reload"]
    assert errors["register"].startswith("RuntimeError:")
    assert "init_process_group() first" in errors["register"]
    assert errors["timeout"] == "TypeError: timeout must be a datetime.timedelta or None, got int"
    assert errors["backends"].startswith("TypeError: accelerator_backends must be backend names")


def _edge_cases(ctx: Rank) -> dict:
    import torch

    import reloadpg_autopatch
    from reloadpg_autopatch.groups import registry
    from tests.support.programs import slime_like

    dist = ctx.patched("auto")
    reloadpg_autopatch.register_default_process_group(accelerator_backends=("gloo",))
    out = {}
    # Built by hand: reload must recreate it over its own ranks, not over WORLD.
    native = reloadpg_autopatch._originals.original("new_group")([0, 1])
    direct = reloadpg_autopatch.ReloadableProcessGroup(native, [0, 1])
    out["direct_kwargs"] = direct._record.kwargs

    # A group created while WORLD is swapped out is rebuilt on the restored WORLD.
    reloadpg_autopatch.destroy_process_groups()
    asleep = dist.new_group([0, 1])
    reloadpg_autopatch.reload_process_groups()
    sums = []
    for group in (asleep, direct):
        t = torch.ones(1)
        dist.all_reduce(t, group=group)
        sums.append(t.item())
    out["sums_after_reload"] = sums
    out["direct_size_after_reload"] = dist.get_world_size(direct)

    # Destroying our group through its native handle releases it like the wrapper would.
    handle = asleep.group
    dist.destroy_process_group(handle)
    out["released_via_native"] = asleep._record.state.value

    # Destroying WORLD through a foreign wrapper forgets every record and the registration.
    foreign_class, _, _ = slime_like.apply()
    world_wrapper = foreign_class(dist.GroupMember.WORLD, (), {})
    dist.destroy_process_group(world_wrapper)
    out["after_world_destroyed"] = [
        dist.is_initialized(),
        [r.state.value for r in registry.records()],
        reloadpg_autopatch.groups.store.channel.is_registered(),
    ]
    return out


def test_edge_cases_of_the_lifecycle() -> None:
    for report in run_ranks(_edge_cases, 2):
        assert report["direct_kwargs"] == {"ranks": [0, 1]}
        assert report["sums_after_reload"] == [2.0, 2.0]
        assert report["direct_size_after_reload"] == 2
        assert report["released_via_native"] == "released"
        assert report["after_world_destroyed"] == [False, [], False]


def _accelerator_policy(ctx: Rank) -> dict:
    dist = ctx.patched("auto")

    def creator(store, rank, size, timeout):  # gloo inside, registered like nccl: no CPU
        return dist.ProcessGroupGloo(store, rank, size, timeout)

    dist.Backend.register_backend("cudaonlytest", creator, devices=["cuda"])
    pair = dist.new_group([0, 1], backend="cudaonlytest")
    singles = [dist.new_group([r], backend="cudaonlytest") for r in range(2)]
    return {"pair": type(pair).__name__, "single": type(singles[ctx.rank]).__name__}


def test_auto_policy_leaves_single_rank_accelerator_groups_native() -> None:
    """slime's rule on a backend torch registers for no CPU device, as it registers nccl."""
    for kinds in run_ranks(_accelerator_policy, 2):
        assert kinds == {"pair": "ReloadableProcessGroup", "single": "ProcessGroup"}


# ---- the wrap policy and single-rank groups, in every mode -----------------------------------


def _policy_in_every_mode(ctx: Rank) -> dict[str, Any]:
    torch, dist, rpg, s = accelerator.start(ctx, "wrapper")
    modes = ["wrapper", "suspend", "auto"] + (["native"] if accelerator.ON_214 else [])
    groups: dict[str, Any] = {}
    for mode in modes:
        rpg.set_reload_mode(mode)
        rpg.set_wrap_policy("none")
        groups[f"{mode} none standin"] = dist.new_group([0, 1], backend=s.NAME_A)
        groups[f"{mode} none gloo"] = dist.new_group([0, 1])
        # One the default rule would wrap: its backend serves an accelerator only.
        groups[f"{mode} none accelerator"] = dist.new_group([0, 1], backend=accelerator.ACCEL)
        rpg.set_wrap_policy("auto")
        singles = [dist.new_group([r], backend=s.NAME_A) for r in range(2)]
        groups[f"{mode} single standin"] = singles[ctx.rank]
        gloo_singles = [dist.new_group([r]) for r in range(2)]
        groups[f"{mode} single gloo"] = gloo_singles[ctx.rank]
    native = torch._C._distributed_c10d.ProcessGroup
    out: dict[str, Any] = {"types": {k: type(g) is native for k, g in groups.items()}}
    ids = {k: id(g) for k, g in groups.items()}
    calls = len(s.CALLS)
    for mode in modes:
        rpg.set_reload_mode(mode)
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
    out["lifecycle calls"] = [c.op for c in s.CALLS[calls:] if c.op in ("suspend", "resume")]
    out["same objects in torch's map"] = all(
        any(id(g) == ids[k] for g in dist.distributed_c10d._world.pg_map) for k in groups
    )
    out["sums"] = {  # an accelerator-only group takes no CPU tensor
        k: accelerator.rank_sum(dist, torch, ctx.rank, g)
        for k, g in groups.items()
        if "single" not in k and "accelerator" not in k
    }
    out["single sums"] = {
        k: accelerator.rank_sum(dist, torch, ctx.rank, g)
        for k, g in groups.items()
        if "single" in k
    }
    return out


def test_policy_none_only_unwraps_and_single_rank_groups_stay_native_in_every_mode() -> None:
    """In every mode, ``set_wrap_policy("none")`` leaves every group torch's own (the patch
    only unwraps), one on an accelerator-only backend too, and under the default policy a
    single-rank group stays torch's own even on a backend that can suspend: no cycle
    suspends, resumes or re-creates any of them (the stand-in's log, torch's map holds the
    very same objects), and each gives torch's sums."""
    for rank, out in enumerate(accelerator.run_once(_policy_in_every_mode)):
        assert all(out["types"].values()), (rank, out["types"])
        assert out["lifecycle calls"] == [], (rank, out["lifecycle calls"])
        assert out["same objects in torch's map"]
        assert set(out["sums"].values()) == {3.0}, out["sums"]
        assert set(out["single sums"].values()) == {float(rank + 1)}, out["single sums"]
