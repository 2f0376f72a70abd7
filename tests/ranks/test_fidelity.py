"""Fidelity: torch's own distributed machinery cannot tell our groups from native ones.

torch's c10d functions (unpatched, bound by torch's modules at import, or named after start-up)
accept reloadable groups; Megatron's ``destroy_model_parallel`` frees exactly the native groups
it means to; every name cached before a cycle (DeviceMesh's, the user's ``group_name``, a
hashed local-sync name) resolves after it to a live group with the same members; DTensor's
``full_tensor()`` round-trips and FSDP2 trains across cycles. Dynamo is
``test_fidelity_compiled``; the objects and calls themselves are ``test_fidelity_objects``.

Every test runs on two gloo ranks that the gate alone activates, using torch normally plus the
public API, and checks again after each of at least two cycles (``tests/support/gated.py``).
The oracles come from outside the package: values of real collectives worked out by hand,
torch's own maps and functions (reached through ``inspect.unwrap`` or the names torch's modules
bound at import). Where torch unpatched defines the behaviour, the same rank function runs with
the gate off as the control and must meet the same expectations.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import pytest

from tests.support import gated
from tests.support.ranks import Rank, run_ranks

pytestmark = pytest.mark.timeout(600)

# ---- c10d lookups ---------------------------------------------------------------------


def _c10d_lookups(ctx: Rank) -> None:
    import inspect

    import torch
    import torch.distributed.device_mesh as device_mesh_module
    from torch.distributed import distributed_c10d as c10d
    from torch.distributed.device_mesh import DeviceMesh

    dist, active = gated.start(ctx)
    rank = ctx.rank
    names = ("get_process_group_ranks", "get_rank", "get_world_size", "get_group_rank")
    names += ("get_global_rank", "_get_group_tag", "broadcast_object_list")
    torch_fn = {name: inspect.unwrap(getattr(c10d, name)) for name in names}
    # Bound by device_mesh when torch.distributed imported it, before any hook could fire.
    mesh_ranks = device_mesh_module.get_process_group_ranks
    groups = gated.pair_and_single(dist, active, rank)
    pair = groups["pair"][0]
    from tests.support import late_c10d as late  # bound after start-up, from distributed_c10d

    try:
        mesh_before, mesh_error = DeviceMesh.from_group(pair, "cpu"), ""
    except Exception as error:
        mesh_before, mesh_error = None, f"{type(error).__name__}: {error}"
    for stage in gated.stages(active):
        problems = []
        if mesh_error:
            problems.append(f"{stage}: DeviceMesh.from_group(g, 'cpu') raised {mesh_error}")
        for label, (group, members) in groups.items():
            native = gated.unwrap(group) if active else group
            index, tag = members.index(rank), torch_fn["_get_group_tag"]
            calls = [
                ("get_process_group_ranks(g)", torch_fn["get_process_group_ranks"], (), members),
                ("device_mesh's get_process_group_ranks(g)", mesh_ranks, (), members),
                (
                    "late-bound get_process_group_ranks(g)",
                    late.get_process_group_ranks,
                    (),
                    members,
                ),
                ("get_rank(g)", torch_fn["get_rank"], (), index),
                ("get_world_size(g)", torch_fn["get_world_size"], (), len(members)),
                ("get_group_rank(g, rank)", torch_fn["get_group_rank"], (rank,), index),
                ("get_global_rank(g, index)", torch_fn["get_global_rank"], (index,), rank),
                ("_get_group_tag(g)", tag, (), tag(native)),
            ]
            for what, function, args, want in calls:
                try:
                    got = function(group, *args)
                except Exception as error:
                    got = f"{type(error).__name__}: {error}"
                if got != want:
                    problems.append(f"{stage}: {label}: torch's {what} gave {got!r}, want {want!r}")
        assert not problems, "\n".join(problems)  # before any collective: no peer left hanging

        for label, (group, members) in groups.items():
            broadcasts = {"torch's": torch_fn["broadcast_object_list"]}
            broadcasts["late-bound"] = late.broadcast_object_list
            for how, broadcast in broadcasts.items():
                objects = [{"stage": stage, "from": rank}]
                broadcast(objects, src=members[0], group=group)
                want = {"stage": stage, "from": members[0]}
                assert objects == [want], f"{stage}: {how} broadcast_object_list on {label}"
            t = torch.tensor([rank + 1.0])
            late.all_reduce(t, group=group)
            want_sum = sum(r + 1.0 for r in members)
            assert t.item() == want_sum, f"{stage}: late-bound all_reduce on {label}: {t.item()}"

        meshes = {
            "made before the cycles": mesh_before,
            "made now": DeviceMesh.from_group(pair, "cpu"),
        }
        for how, mesh in meshes.items():
            mesh_group = mesh.get_group()
            ranks = torch_fn["get_process_group_ranks"](mesh_group)
            assert ranks == [0, 1], f"{stage}: mesh {how}: its group has ranks {ranks}"
            assert (mesh.size(), mesh.get_local_rank()) == (2, rank), f"{stage}: mesh {how}"
            t = torch.tensor([rank + 1.0])
            dist.all_reduce(t, group=mesh_group)
            assert t.item() == 3.0, f"{stage}: all_reduce on the group of the mesh {how}"

        managers = {"torch.distributed": dist._coalescing_manager}
        managers["distributed_c10d"] = late._coalescing_manager
        ops = {"torch.distributed": dist.all_reduce, "distributed_c10d": late.all_reduce}
        for manager_from, manager in managers.items():
            for op_from, op in ops.items():
                what = f"{stage}: {op_from}.all_reduce in {manager_from}._coalescing_manager"
                a, b = torch.tensor([rank + 1.0]), torch.tensor([10.0 * (rank + 1)])
                with manager(group=pair, async_ops=True) as batch:
                    works = [op(a, group=pair, async_op=True), op(b, group=pair, async_op=True)]
                kinds = [type(work).__name__ for work in works]
                for work in works:  # keep both ranks in step whatever happened
                    if not isinstance(work, c10d._IllegalWork) and work is not None:
                        work.wait()
                if all(isinstance(work, c10d._IllegalWork) for work in works):
                    batch.wait()
                assert kinds == ["_IllegalWork", "_IllegalWork"], f"{what}: got {kinds}"
                assert (a.item(), b.item()) == (3.0, 30.0), f"{what}: sums {a.item(), b.item()}"


@gated.GATES
def test_torchs_own_c10d_functions_accept_reloadable_groups(env) -> None:
    """torch's c10d functions look groups up in ``_world`` maps keyed by the native object, and
    torch's modules bound them at import (DeviceMesh binds ``get_process_group_ranks``). Given a
    reloadable group, torch's unpatched functions, those bindings, and names bound from
    ``distributed_c10d`` after start-up must give the native group's answer; ``DeviceMesh``
    ``.from_group`` must work; ops inside ``_coalescing_manager`` must join the batch (torch's
    ``_IllegalWork`` marker), as they do for a native group in the control."""
    run_ranks(_c10d_lookups, 2, env=env, timeout=gated.RANK_TIMEOUT)


# ---- Megatron -------------------------------------------------------------------------


def _megatron(ctx: Rank) -> list[dict[str, Any]]:
    import torch
    from megatron.core import parallel_state as ps
    from torch.distributed import distributed_c10d as c10d

    dist, active = gated.start(ctx)
    rank = ctx.rank
    if active:
        import reloadpg_autopatch as rpg

        rpg.register_default_process_group(accelerator_backends=("gloo",))

    def natives() -> int:
        return sum(1 for pg in c10d._world.pg_map if type(pg) is gated.native_type())

    def check(stage: str, tp: Any, dp_gloo: Any) -> None:
        for label, group, want in (("tp", tp, 3.0), ("dp_gloo", dp_gloo, rank + 1.0)):
            t = torch.tensor([rank + 1.0])
            dist.all_reduce(t, group=group)
            assert t.item() == want, f"{stage}: all_reduce on Megatron's {label}: {t.item()}"

    reports = []
    stages = gated.stages(active)
    next(stages)
    for cycle in range(1, gated.CYCLES + 1):
        ps.initialize_model_parallel(tensor_model_parallel_size=2)
        gloo = {
            "data_parallel_gloo": ps.get_data_parallel_group_gloo(),
            "data_parallel_with_cp_gloo": ps.get_data_parallel_group_gloo(
                with_context_parallel=True
            ),
            "expert_data_parallel_gloo": ps.get_expert_data_parallel_group_gloo(),
        }
        tp = ps.get_tensor_model_parallel_group()
        gated.reloadable(active, tp, *gloo.values())
        check(f"cycle {cycle}, after init", tp, gloo["data_parallel_gloo"])
        stage = next(stages)  # destroy + reload (gate on)
        check(f"{stage}", tp, gloo["data_parallel_gloo"])
        # Megatron destroys a gloo group only if torch's map knows it: its own test, verbatim.
        unknown = [k for k, g in gloo.items() if c10d._world.pg_map.get(g, None) is None]
        assert not unknown, f"{stage}: _world.pg_map.get(group) is None for {unknown}"
        held = {k: (gated.unwrap(g) if active else g) for k, g in gloo.items()}
        before = natives()
        ps.destroy_model_parallel()
        after = natives()
        still_mapped = [k for k, native in held.items() if native in c10d._world.pg_map]
        usable = []
        for label, group in gloo.items():
            with contextlib.suppress(Exception):  # torch: KeyError; ours: a RuntimeError
                c10d.get_process_group_ranks(group)
                usable.append(label)
        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t, group=tp)  # Megatron drops tp without destroying it
        assert t.item() == 3.0, f"{stage}: tp after destroy_model_parallel: {t.item()}"
        reports.append(
            {
                "destroyed": before - after,
                "distinct": len({id(native) for native in held.values()}),
                "still_mapped": still_mapped,
                "usable": usable,
            }
        )
    return reports


@gated.GATES
def test_megatron_destroy_model_parallel_destroys_its_gloo_groups(env) -> None:
    """``destroy_model_parallel`` destroys a gloo group only when
    ``_world.pg_map.get(group)`` finds it. After a destroy/reload, Megatron's own call must
    free exactly the native groups it means to (counted in torch's map, as in the control),
    and torch must then refuse the destroyed groups, while the groups it keeps still work."""
    for reports in run_ranks(_megatron, 2, env=env, timeout=gated.RANK_TIMEOUT):
        assert len(reports) == gated.CYCLES
        for report in reports:
            assert report["distinct"] == 3
            assert report["destroyed"] == report["distinct"], report
            assert report["still_mapped"] == [], report
            assert report["usable"] == [], report


# ---- names cached before a cycle; DTensor; FSDP2 -------------------------------------------------


def _names(ctx: Rank) -> list[dict[str, Any]]:
    import torch
    from torch.distributed import distributed_c10d as c10d
    from torch.distributed.device_mesh import init_device_mesh

    dist, active = gated.start(ctx)
    rank = ctx.rank
    gated.world_in_cycle(active)
    want = {"dp": [0, 1], "tp": [rank]}
    # A mesh made before the user's groups (their replay can take its names) and one after.
    meshes = {"first mesh": init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))}
    pair = dist.new_group([0, 1])
    single = [dist.new_group([0]), dist.new_group([1])][rank]
    local = dist.new_group([0, 1], use_local_synchronization=True)  # a hashed name
    gated.reloadable(active, pair, single, local)
    meshes["last mesh"] = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))
    live = {"pair": (pair, [0, 1]), "single": (single, [rank]), "local pair": (local, [0, 1])}
    cached = {label: (group.group_name, members) for label, (group, members) in live.items()}
    for mesh_label, mesh in meshes.items():
        for index, (dim, members) in enumerate(want.items()):
            cached[f"{mesh_label} {dim}"] = (mesh._dim_group_names[index], members)
    reports = []
    for stage in gated.stages(active):
        seen, expected, groups = {}, {}, {}
        for mesh_label, mesh in meshes.items():
            for dim, members in want.items():
                what = f"{mesh_label}.get_group({dim!r})"
                groups[what], seen[what] = gated.resolve_ranks(mesh.get_group, dim)
                expected[what] = members
        for label, (name, members) in cached.items():
            what = f"cached name {name!r} of {label}"
            groups[what], seen[what] = gated.resolve_ranks(c10d._resolve_process_group, name)
            expected[what] = members
        for label, (group, members) in live.items():
            what = f"current name of {label}"
            name = group.group_name
            groups[what], seen[what] = gated.resolve_ranks(c10d._resolve_process_group, name)
            expected[what] = members
        wrong = {k: f"{seen[k]}, want {m}" for k, m in expected.items() if seen[k] != m}
        assert not wrong, f"{stage}: " + "; ".join(f"{k}: {v}" for k, v in wrong.items())
        for what, group in groups.items():  # every rank agrees: now real collectives
            t = torch.tensor([rank + 1.0])
            dist.all_reduce(t, group=group)
            want_sum = sum(r + 1.0 for r in expected[what])
            assert t.item() == want_sum, f"{stage}: all_reduce on {what}: {t.item()}"
        reports.append(seen)
    return reports


@gated.GATES
def test_every_cached_name_resolves_to_the_same_group_after_each_reload(env) -> None:
    """DeviceMesh and functional collectives find groups by name, and destroying WORLD resets
    torch's group counter. After each cycle (WORLD included), every name cached before it (by
    ``init_device_mesh``, by the user through ``group_name``, a hashed name from
    ``use_local_synchronization``) must resolve on every rank to a live group with the same
    members, and a real all_reduce on it must give the members' sum."""
    reports = run_ranks(_names, 2, env=env, timeout=gated.RANK_TIMEOUT)
    for rank, stages in enumerate(reports):
        assert len(stages) == gated.CYCLES + 1
        for seen in stages:
            assert seen["first mesh.get_group('tp')"] == [rank]
            assert seen["last mesh.get_group('dp')"] == [0, 1]


def _dtensor(ctx: Rank) -> None:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    _, active = gated.start(ctx)
    gated.world_in_cycle(active)
    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))
    full = torch.arange(8.0).reshape(4, 2)
    mine = full[2 * ctx.rank : 2 * ctx.rank + 2]
    kept = {
        "2-D": distribute_tensor(full, mesh, [Shard(0), Replicate()]),
        "dp": distribute_tensor(full, mesh["dp"], [Shard(0)]),
    }
    for stage in gated.stages(active):
        try:
            fresh = {
                "2-D": distribute_tensor(full, mesh, [Shard(0), Replicate()]),
                "dp": distribute_tensor(full, mesh["dp"], [Shard(0)]),
            }
        except Exception as error:
            raise AssertionError(f"{stage}: distribute_tensor raised {error!r}") from error
        for when, tensors in (("made before the cycles", kept), ("made now", fresh)):
            for label, dt in tensors.items():
                what = f"{stage}: {label} DTensor {when}"
                assert torch.equal(dt.to_local(), mine), f"{what}: local {dt.to_local()}"
                assert torch.equal(dt.full_tensor(), full), f"{what}: full {dt.full_tensor()}"
                assert torch.equal((dt * 2).full_tensor(), 2 * full), f"{what}: dt * 2"


@gated.GATES
def test_dtensor_full_tensor_round_trips_across_cycles(env) -> None:
    """``distribute_tensor(...).full_tensor()`` runs collectives on the groups DeviceMesh holds
    by name; on an ``init_device_mesh`` mesh whose WORLD takes part in the cycle, it must give
    back the original tensor before and after each reload, for DTensors made before the cycles
    and after them."""
    run_ranks(_dtensor, 2, env=env, timeout=gated.RANK_TIMEOUT)


def _fsdp2(ctx: Rank, mesh_kind: str) -> None:
    import inspect

    import torch
    from torch import nn
    from torch.distributed import distributed_c10d as c10d
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist, active = gated.start(ctx)
    rank = ctx.rank
    gated.world_in_cycle(active)
    if mesh_kind == "init_device_mesh":
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    else:
        pair = dist.new_group([0, 1])
        gated.reloadable(active, pair)
        mesh = DeviceMesh.from_group(pair, "cpu", mesh_dim_names=("dp",))
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    reference = nn.Linear(4, 2)  # the same module, unsharded, trained by hand on both inputs
    reference.load_state_dict(model.state_dict())
    fully_shard(model, mesh=mesh)
    # FSDP2 keeps the group object it resolved from the mesh at fully_shard time.
    held = model._get_fsdp_state()._fsdp_param_group.mesh_info.shard_process_group
    torch_ranks = inspect.unwrap(c10d.get_process_group_ranks)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, stage in enumerate(gated.stages(active)):
        # gloo keeps serving a destroyed group; NCCL would not: ask torch whether it is live.
        try:
            ranks = torch_ranks(held)
        except Exception as error:
            ranks = f"{type(error).__name__}: {error}"
        assert ranks == [0, 1], f"{stage}: the group FSDP2 holds ({held!r}) is gone: {ranks}"
        inputs = [torch.arange(12.0).reshape(3, 4) * (r + 1) / 10 + step for r in range(2)]
        optimizer.zero_grad()
        out = model(inputs[rank])
        out.sum().backward()
        reference.zero_grad()
        want_out = reference(inputs[rank])
        for x in inputs:
            reference(x).sum().backward()
        with torch.no_grad():  # FSDP2 averages the gradient over the data-parallel ranks
            grads = {name: p.grad / 2 for name, p in reference.named_parameters()}
        what = f"{stage}: FSDP2 over a {mesh_kind} mesh"
        assert torch.allclose(out, want_out), f"{what}: forward {out} != {want_out}"
        for name, param in model.named_parameters():
            got = param.grad.full_tensor()
            assert torch.allclose(got, grads[name]), f"{what}: {name}.grad {got} != {grads[name]}"
        optimizer.step()
        with torch.no_grad():
            for name, p in reference.named_parameters():
                p.sub_(0.1 * grads[name])
        for name, param in model.named_parameters():
            got = param.full_tensor()
            want = dict(reference.named_parameters())[name]
            assert torch.allclose(got, want), f"{what}: {name} after the step {got} != {want}"


@gated.GATES
@pytest.mark.parametrize("mesh_kind", ["init_device_mesh", "from_group"])
def test_fsdp2_trains_across_cycles(env, mesh_kind) -> None:
    """FSDP2 ``fully_shard`` runs on CPU over gloo (no CUDA needed). It keeps the group object
    it resolved from the mesh at ``fully_shard`` time (``FSDPMeshInfo.shard_process_group``), so
    after each reload that object must still be one torch knows (gloo would keep serving a
    destroyed group; NCCL would not), and a forward/backward/step must give exactly what an
    unsharded copy trained by hand gives, over a mesh from ``init_device_mesh`` (WORLD in the
    cycle) and one from ``DeviceMesh.from_group`` on a reloadable group (Megatron's FSDP path)."""
    run_ranks(
        functools.partial(_fsdp2, mesh_kind=mesh_kind), 2, env=env, timeout=gated.RANK_TIMEOUT
    )
