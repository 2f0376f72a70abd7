"""Native mode: groups reloaded in place (torch 2.14's ProcessGroup.reconfigure), no wrapper.

On torch 2.14.1 (the second CI lane) the groups the program holds are torch's own objects, the
same ones before and after every cycle, in torch's own maps; ``auto`` keeps a group torch cannot
reconfigure (one with several backends) behind a wrapper. On torch 2.13 ``native`` refuses with
a message that says why, and ``auto`` falls back. Real gloo ranks, activated by the gate alone.
"""

from __future__ import annotations

import pytest

from tests.support.ranks import GATE, Rank, run_ranks

pytestmark = pytest.mark.timeout(300)


def _torch_reconfigures() -> bool:
    import torch.distributed as dist

    return hasattr(dist.ProcessGroup, "reconfigure")


needs_reconfigure = pytest.mark.skipif(
    not _torch_reconfigures(), reason="this torch has no ProcessGroup.reconfigure (2.14+)"
)
without_reconfigure = pytest.mark.skipif(
    _torch_reconfigures(), reason="this torch can reconfigure: the fallback is not exercised"
)


def _in_place(ctx: Rank) -> dict:
    import gc
    import time

    import torch
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed import distributed_c10d as c10d
    from torch.distributed.device_mesh import DeviceMesh

    import reloadpg_autopatch as rpg

    ctx.init()
    rpg.register_default_process_group()
    pair = dist.new_group([0, 1])
    local = dist.new_group([0, 1], use_local_synchronization=True)
    held = {"pair": pair, "local": local, "world": dist.group.WORLD}
    ids = {label: id(group) for label, group in held.items()}
    names = {label: group.group_name for label, group in held.items()}
    mesh = DeviceMesh.from_group(pair, "cpu")

    def step(x):
        y = x * 2
        dist.all_reduce(y, group=pair)
        return y

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    cycles = []
    for cycle in range(3):
        if ctx.rank == cycle % 2:  # ranks arrive seconds apart, each in turn
            time.sleep(2)
        rpg.destroy_process_groups()
        if ctx.rank == cycle % 2:
            time.sleep(2)
        rpg.reload_process_groups()
        sums = {}
        for label, group in held.items():
            t = torch.tensor([ctx.rank + 1.0])
            dist.all_reduce(t, group=group)
            sums[label] = t.item()
        cycles.append(
            {
                "types": sorted({type(g).__name__ for g in held.values()}),
                "same_objects": all(id(g) == ids[k] for k, g in held.items()),
                "names": {k: g.group_name for k, g in held.items()} == names,
                "in_torch_maps": all(g in c10d._world.pg_map for g in held.values()),
                "resolve": all(c10d._resolve_process_group(names[k]) is g for k, g in held.items()),
                "sums": sums,
                "mesh": dist.get_process_group_ranks(mesh.get_group()),
                "funcol": funcol.all_reduce(torch.ones(1), "sum", pair).wait().item(),
                "compiled": compiled(torch.ones(1)).item(),
            }
        )
    wrappers = sum(type(o).__name__ == "ReloadableProcessGroup" for o in gc.get_objects())
    return {
        "cycles": cycles,
        "wrappers": wrappers,
        "reloadable": [type(g).__name__ for g in rpg.reloadable_groups()],
        "collectives_patched": hasattr(dist.all_reduce, "__reloadpg_autopatch__"),
        "patched": sorted(rpg.patched_names()),
    }


@needs_reconfigure
def test_native_mode_reloads_torchs_own_groups_in_place() -> None:
    """Over 10 s on torch 2.14.1: every cycle reconfigures each group in place, a store exchange
    of handles per group."""
    env = {**GATE, "SLIME_RELOADABLE_PG_MODE": "native"}
    for report in run_ranks(_in_place, 2, env=env, timeout=240):
        for cycle in report["cycles"]:
            assert cycle["types"] == ["ProcessGroup"]
            assert cycle["same_objects"]
            assert cycle["names"]
            assert cycle["in_torch_maps"]
            assert cycle["resolve"]
            assert cycle["sums"] == {"pair": 3.0, "local": 3.0, "world": 3.0}
            assert cycle["mesh"] == [0, 1]
            assert cycle["funcol"] == 2.0
            assert cycle["compiled"] == 4.0
        assert report["wrappers"] == 0  # no stand-in anywhere, not even for WORLD
        assert report["reloadable"] == ["ProcessGroup", "ProcessGroup"]
        # Nothing stands in for a group, so the collectives are torch's own: no wrapper at all.
        assert not report["collectives_patched"]
        assert report["patched"] == [
            "destroy_process_group",
            "new_group",
            "new_subgroups",
            "new_subgroups_by_enumeration",
        ]


def _auto(ctx: Rank) -> dict:
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed import fake_pg  # noqa: F401 - torch's "fake" backend

    import reloadpg_autopatch as rpg

    ctx.init()
    rpg.set_wrap_policy("all")
    gloo = dist.new_group([0, 1])
    mixed = dist.new_group([0, 1], backend="cpu:gloo,cuda:fake")  # two backends
    out = {"gloo": type(gloo).__name__, "mixed": type(mixed).__name__}
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    sums = []
    for group in (gloo, mixed):
        t = torch.ones(1)
        dist.all_reduce(t, group=group)
        sums.append(t.item())
    out["sums"] = sums
    out["collectives_patched"] = hasattr(dist.all_reduce, "__reloadpg_autopatch__")
    return out


@needs_reconfigure
def test_auto_mode_picks_in_place_for_gloo_and_a_wrapper_for_several_backends() -> None:
    env = {**GATE, "SLIME_RELOADABLE_PG_MODE": "auto"}
    for report in run_ranks(_auto, 2, env=env):
        assert report["gloo"] == "ProcessGroup"
        assert report["mixed"] == "ReloadableProcessGroup"
        assert report["sums"] == [2.0, 2.0]
        assert report["collectives_patched"]  # a wrapper exists, so collectives unwrap


def _refused(ctx: Rank) -> dict:
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    ctx.init()
    rpg.set_wrap_policy("all")
    out = {}
    try:
        dist.new_group([0, 1])
        out["native"] = "no error"
    except RuntimeError as error:
        out["native"] = str(error)
    rpg.set_reload_mode("auto")
    out["auto"] = type(dist.new_group([0, 1])).__name__
    try:
        rpg.set_reload_mode("fastest")
    except ValueError as error:
        out["bad"] = str(error)
    return out


@without_reconfigure
def test_native_mode_refuses_clearly_where_torch_cannot_and_auto_falls_back() -> None:
    env = {**GATE, "SLIME_RELOADABLE_PG_MODE": "native"}
    for report in run_ranks(_refused, 2, env=env):
        assert "cannot be reloaded in place" in report["native"]
        assert "has no ProcessGroup.reconfigure (torch 2.14 and later)" in report["native"]
        assert "use mode 'auto'" in report["native"]
        assert report["auto"] == "ReloadableProcessGroup"
        assert "'wrapper', 'native', 'suspend', 'auto'" in report["bad"]
