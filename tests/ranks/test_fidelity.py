"""Fidelity: torch, Megatron and user code cannot tell our groups and wrappers from native ones.

Every test runs on two gloo ranks that the gate alone activates (``SLIME_RELOADABLE_PG=1`` in
the ranks' environment from their start, no explicit patch call). Ranks use torch normally plus the
public API, and check again after each of at least two destroy/reload cycles. The oracles come
from outside the package: values of real collectives worked out by hand, torch's own maps and
functions (reached through ``inspect.unwrap`` or the names torch's modules bound at import),
the graphs Dynamo hands to a recording backend, pickle round trips. Where torch unpatched
defines the behaviour, the same rank function runs with the gate off as the control and must
meet the same expectations.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from typing import Any

import pytest

from tests.support import gated
from tests.support.ranks import Rank, run_ranks

pytestmark = pytest.mark.timeout(600)

GATHERS = ("all_gather_into_tensor", "all_gather_single", "_all_gather_base", "all_gather")
SCATTERS = ("reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base")
COLLECTIVES = ("all_reduce", *GATHERS, *SCATTERS, "all_to_all_single")
P2P = ("isend/irecv", "batch_isend_irecv")


def _x(rank: int) -> list[float]:
    return [rank + 1.0, 10.0 * (rank + 1)]


def _expect(case: str, rank: int, members: list[int]) -> list[float]:
    """What ``case`` returns on ``rank`` for a group of ``members``, worked out by hand."""
    xs = [_x(r) for r in members]
    size, index = len(members), members.index(rank)
    mine = slice(index * (2 // size), (index + 1) * (2 // size))
    if case == "all_reduce":
        return [2 * sum(x[k] for x in xs) + 1 for k in range(2)]
    if case in GATHERS:
        return [v for x in xs for v in x]
    if case in SCATTERS:
        return [sum(x[k] for x in xs) for k in range(2)][mine]
    if case == "all_to_all_single":
        return [v for x in xs for v in x[mine]]
    if case in P2P:  # the first member sends x + 1, the second receives it; both return 2y
        return [2 * (v + 1) for v in _x(members[0])]
    raise KeyError(case)


class _Recorder:
    """A Dynamo backend that records each graph's call targets and counts the graphs' runs."""

    def __init__(self, inner: Any = None) -> None:
        self.inner = inner
        self.graphs: list[list[str]] = []
        self.runs = 0

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        targets = sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        self.graphs.append(targets)
        compiled = gm.forward if self.inner is None else self.inner(gm, example_inputs)

        def run(*args: Any) -> Any:
            self.runs += 1
            return compiled(*args)

        return run

    def functional(self) -> bool:
        """Whether the collective became a functional collective inside a graph."""
        return any("c10d_functional" in target for graph in self.graphs for target in graph)


def _cases(group: Any, members: list[int], rank: int) -> dict[str, Any]:
    """One function per collective that Dynamo remaps, written the way user code calls them."""
    import torch
    import torch.distributed as dist

    size = len(members)
    sending = rank == members[0]
    peer = members[1 - members.index(rank)] if size == 2 else None

    def all_reduce(x):
        y = x * 2
        dist.all_reduce(y, group=group)
        return y + 1

    def all_gather_into_tensor(x):
        out = x.new_zeros(2 * size)
        dist.all_gather_into_tensor(out, x, group=group)
        return out

    def all_gather_single(x):
        out = x.new_zeros(2 * size)
        dist.all_gather_single(out, x, group=group)
        return out

    def _all_gather_base(x):
        out = x.new_zeros(2 * size)
        dist._all_gather_base(out, x, group=group)
        return out

    def all_gather(x):
        parts = [x.new_zeros(2) for _ in range(size)]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts)

    def reduce_scatter_tensor(x):
        out = x.new_zeros(2 // size)
        dist.reduce_scatter_tensor(out, x, group=group)
        return out

    def reduce_scatter_single(x):
        out = x.new_zeros(2 // size)
        dist.reduce_scatter_single(out, x, group=group)
        return out

    def _reduce_scatter_base(x):
        out = x.new_zeros(2 // size)
        dist._reduce_scatter_base(out, x, group=group)
        return out

    def all_to_all_single(x):
        out = torch.zeros_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    def isend_irecv(x):
        y = x + 1
        if sending:
            dist.isend(y, peer, group=group).wait()
        else:
            dist.irecv(y, peer, group=group).wait()
        return y * 2

    def batch_isend_irecv(x):
        y = x + 1
        op = dist.P2POp(dist.isend if sending else dist.irecv, y, peer, group)
        for work in dist.batch_isend_irecv([op]):
            work.wait()
        return y * 2

    return {
        **{f.__name__: f for f in (all_reduce, all_gather_into_tensor, all_gather_single)},
        **{f.__name__: f for f in (_all_gather_base, all_gather, reduce_scatter_tensor)},
        **{f.__name__: f for f in (reduce_scatter_single, _reduce_scatter_base)},
        "all_to_all_single": all_to_all_single,
        "isend/irecv": isend_irecv,
        "batch_isend_irecv": batch_isend_irecv,
    }


def _first_lines(counter: Any) -> list[str]:
    """Dynamo's graph-break reasons, by kind (the first line; the rest holds addresses)."""
    return sorted(f"{reason.splitlines()[0]} x{count}" for reason, count in counter.items())


# ---- 1. Dynamo ---------------------------------------------------------------------------


def _compiled_matrix(ctx: Rank, cases: tuple[str, ...]) -> list[str]:
    """Compile each case with fullgraph=True on every kind of group; report what went wrong."""
    import torch
    import torch._dynamo
    from torch._dynamo.backends.registry import lookup_backend

    dist, active = gated.start(ctx)
    torch._dynamo.config.recompile_limit = 64
    rank = ctx.rank
    groups = {label: (g, [0, 1]) for label, g in gated.pair_groups(dist, active).items()}
    if active and "all_reduce" in cases:
        single = [dist.new_group([0]), dist.new_group([1])][rank]
        gated.reloadable(active, single)
        groups["reloadable single"] = (single, [rank])
    problems: list[str] = []
    compiled = []  # (label, case, members, recorder, compiled function), kept across the cycles
    for label, (group, members) in groups.items():
        functions = _cases(group, members, rank)
        for case in cases:
            variants = [("eager", True)]
            if case in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"):
                variants.append(("aot_eager", True))
            if case == "all_reduce":
                variants.append(("eager", False))  # no fullgraph: must not run eagerly unseen
            for backend, fullgraph in variants:
                what = f"{label}: {case} [{backend}, fullgraph={fullgraph}]"
                # Dynamo marks a code object it failed on as skipped: start each case afresh.
                torch._dynamo.reset()
                recorder = _Recorder(lookup_backend(backend) if backend != "eager" else None)
                function = torch.compile(functions[case], backend=recorder, fullgraph=fullgraph)
                value = _run_compiled(function, rank)
                if value != _expect(case, rank, members):
                    problems.append(f"{what}: {value}, want {_expect(case, rank, members)}")
                    continue
                if len(recorder.graphs) != 1 or recorder.runs != 1 or not recorder.functional():
                    problems.append(
                        f"{what}: {len(recorder.graphs)} graphs, run {recorder.runs} times, "
                        f"functional collective in a graph: {recorder.functional()}"
                    )
                compiled.append((label, f"{case} [{backend}]", members, recorder, function))
    # Since the last reset, each kept function compiles once more, before any cycle; after
    # each cycle it must run that same compiled code again (or a recompiled graph).
    stages = gated.stages(active)
    next(stages)
    for stage in itertools.chain(["before any cycle, compiled again after the reset"], stages):
        for label, case, members, recorder, function in compiled:
            runs = recorder.runs
            value = _run_compiled(function, rank)
            want = _expect(case.split(" [")[0], rank, members)
            if value != want or recorder.runs != runs + 1:
                problems.append(
                    f"{stage}, {label}: {case}: {value} (want {want}), "
                    f"compiled graph ran {recorder.runs - runs} times"
                )
    return problems


def _run_compiled(function: Any, rank: int) -> Any:
    """The compiled function's value on this rank's input, or the error's first line."""
    import torch

    try:
        return function(torch.tensor(_x(rank))).tolist()
    except Exception as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"


def _assert_no_problems(reports: list[list[str]]) -> None:
    lines = [f"rank {rank}: {line}" for rank, report in enumerate(reports) for line in report]
    assert not lines, "\n".join(lines)


@gated.GATES
def test_compiled_collectives_run_as_one_graph_on_every_kind_of_group(env) -> None:
    """Dynamo remaps a collective only when the callee is torch's own function (a key of
    ``traceable_collective_remaps``) and the group is one it can lift into the graph. Gate off,
    torch compiles each remapped collective with ``fullgraph=True`` on WORLD and a native group
    (the control); gate on, so must ours, on reloadable groups too, and a compiled function that
    captured a reloadable group must still run its graph and give the right sums after each
    reload. The recording backend proves the graph ran: nothing silently fell back to eager."""
    _assert_no_problems(
        run_ranks(
            functools.partial(_compiled_matrix, cases=COLLECTIVES),
            2,
            env=env,
            timeout=gated.RANK_TIMEOUT,
        )
    )


@gated.GATES
def test_compiled_p2p_runs_as_one_graph_when_torch_enables_it(env) -> None:
    """With ``TORCHDYNAMO_ENABLE_P2P_COMPILATION=1`` torch compiles ``isend``/``irecv`` and
    ``batch_isend_irecv`` in one graph (the control); our wrappers and groups must too."""
    _assert_no_problems(
        run_ranks(
            functools.partial(_compiled_matrix, cases=P2P),
            2,
            env={**env, "TORCHDYNAMO_ENABLE_P2P_COMPILATION": "1"},
            timeout=gated.RANK_TIMEOUT,
        )
    )


def _p2p_breaks(ctx: Rank) -> dict[str, Any]:
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    dist, active = gated.start(ctx)
    torch._dynamo.config.recompile_limit = 64
    out: dict[str, Any] = {}
    compiled = []
    for label, group in gated.pair_groups(dist, active).items():
        functions = _cases(group, [0, 1], ctx.rank)
        for case in P2P:
            torch._dynamo.reset()  # each case afresh: nothing learnt from another group
            recorder = _Recorder()
            function = torch.compile(functions[case], backend=recorder)
            counters.clear()
            out[f"{label}: {case}"] = {
                "value": _run_compiled(function, ctx.rank),
                "breaks": _first_lines(counters["graph_break"]),
                "graphs": len(recorder.graphs),
            }
            compiled.append((f"{label}: {case}", function))
    stages = gated.stages(active)
    next(stages)
    for stage in stages:
        for what, function in compiled:
            out[f"{stage}, {what}"] = _run_compiled(function, ctx.rank)
    return out


def test_compiled_p2p_breaks_the_graph_exactly_where_torch_does() -> None:
    """P2P compilation is off by default: torch graph-breaks at ``isend``/``irecv`` and
    ``batch_isend_irecv`` and runs them eagerly. Gate on, the same breaks must happen (same
    kinds, same count) on WORLD, on a native group and on a reloadable one, with the same
    values, before and after reloads."""
    control = run_ranks(_p2p_breaks, 2, env=gated.OFF, timeout=gated.RANK_TIMEOUT)
    ours = run_ranks(_p2p_breaks, 2, env=gated.ON, timeout=gated.RANK_TIMEOUT)
    want_value = _expect("isend/irecv", 0, [0, 1])
    for rank in range(2):
        for case in P2P:
            native = control[rank][f"native: {case}"]
            assert native["value"] == want_value
            assert native["breaks"], "torch no longer graph-breaks here: revisit this control"
            for label in ("world", "native"):
                key = f"{label}: {case}"
                got, want = ours[rank][key], control[rank][key]
                assert got == want, f"rank {rank}, {key}: gate on {got}, gate off {want}"
            got = ours[rank][f"reloadable: {case}"]
            assert got == native, f"rank {rank}, reloadable: {case}: {got}, native group {native}"
            for cycle in range(1, gated.CYCLES + 1):
                for label in ("world", "native", "reloadable"):
                    key = f"after cycle {cycle}, {label}: {case}"
                    assert ours[rank][key] == want_value, (rank, key)


# ---- 2. Functional collectives -----------------------------------------------------------


def _funcol_values(funcol: Any, target: Any, members: list[int], rank: int) -> dict[str, Any]:
    import torch

    x = torch.tensor(_x(rank))
    out = {
        "all_reduce": (funcol.all_reduce(x * 2, "sum", target) + 1).tolist(),
        "all_gather_into_tensor": funcol.all_gather_tensor(x, 0, target).tolist(),
        "reduce_scatter_tensor": funcol.reduce_scatter_tensor(x, "sum", 0, target).tolist(),
        "all_to_all_single": funcol.all_to_all_single(x, None, None, target).tolist(),
    }
    if len(members) == 2:
        out["broadcast"] = funcol.broadcast(x, 0, target).tolist()
    return out


def _funcol_expected(members: list[int], rank: int) -> dict[str, Any]:
    out = {case: _expect(case, rank, members) for case in ("all_reduce", "all_to_all_single")}
    out["all_gather_into_tensor"] = _expect("all_gather_into_tensor", rank, members)
    out["reduce_scatter_tensor"] = _expect("reduce_scatter_tensor", rank, members)
    if len(members) == 2:
        out["broadcast"] = _x(members[0])
    return out


def _funcol_reduce(group: Any) -> Any:
    import torch.distributed._functional_collectives as funcol

    def reduce(x):
        return funcol.all_reduce(x * 2, "sum", group) + 1

    return reduce


def _functional(ctx: Rank) -> None:
    import torch
    import torch.distributed._functional_collectives as funcol
    from torch.distributed import distributed_c10d as c10d

    dist, active = gated.start(ctx)
    rank = ctx.rank
    groups = gated.pair_and_single(dist, active, rank)
    cached = {label: group.group_name for label, (group, _) in groups.items()}
    compiled = {}
    for label, (group, _) in groups.items():
        recorder = _Recorder()
        compiled[label] = (recorder, torch.compile(_funcol_reduce(group), backend=recorder))
    for stage in gated.stages(active):
        for label, (group, members) in groups.items():
            want = _funcol_expected(members, rank)
            targets = {"the group": group, "its cached name": cached[label]}
            for how, target in targets.items():
                if isinstance(target, str):  # resolve first: a wrong group would hang the peer
                    _, ranks = gated.resolve_ranks(c10d._resolve_process_group, target)
                    assert ranks == members, f"{stage}: {label} by {how} {target!r}: {ranks}"
                got = _funcol_values(funcol, target, members, rank)
                assert got == want, f"{stage}: funcol on {label} by {how}: {got}, want {want}"
            recorder, function = compiled[label]
            runs = recorder.runs
            value = function(torch.tensor(_x(rank))).tolist()
            assert value == want["all_reduce"], f"{stage}: compiled funcol on {label}: {value}"
            assert recorder.runs == runs + 1, f"{stage}: compiled funcol on {label} ran eagerly"
            assert recorder.functional(), f"{stage}: no functional collective in the graph"


@gated.GATES
def test_functional_collectives_take_reloadable_groups_and_their_names(env) -> None:
    """``_functional_collectives`` resolve a group by name through torch's registry. A reloadable
    group, the name it had before the cycles, and a compiled call that captured it must reach
    the same members before and after each reload; single-rank groups expose a misroute (its
    sum would include the other rank)."""
    run_ranks(_functional, 2, env=env, timeout=gated.RANK_TIMEOUT)


# ---- 3. c10d lookups ---------------------------------------------------------------------


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


def _late_rebind(ctx: Rank) -> dict[str, Any]:
    import torch

    dist, active = gated.start(ctx)
    import reloadpg_autopatch as rpg

    rpg.set_wrap_policy("all")
    group = dist.new_group([0, 1])
    gated.reloadable(active, group)
    from tests.support import late_rebind as late  # holds torch's original when its code runs

    out = {"rebound": late.all_reduce is dist.all_reduce, "sums": []}
    for _stage in gated.stages(active):
        t = torch.tensor([ctx.rank + 1.0])
        late.all_reduce(t, group=group)
        out["sums"].append(t.item())
    return out


@pytest.mark.parametrize(
    "prefixes", ["tests.support.late_rebind", " megatron , tests.support.late_rebind ,"]
)
def test_rebind_sweeps_a_module_under_the_prefixes_when_it_finishes_importing(
    prefixes: str,
) -> None:
    """``SLIME_RELOADABLE_PG_REBIND`` names module prefixes to sweep; a module under them that
    is imported after start-up and holds torch's original must be swept when it finishes
    importing, so its calls reach reloadable groups through the wrapper. Any spelling the sweep
    accepts (spaces, a trailing comma) counts the same at start-up."""
    env = {**gated.ON, "SLIME_RELOADABLE_PG_REBIND": prefixes}
    for report in run_ranks(_late_rebind, 2, env=env, timeout=gated.RANK_TIMEOUT):
        assert report["rebound"], "tests.support.late_rebind.all_reduce is still torch's original"
        assert report["sums"] == [3.0] * (gated.CYCLES + 1)


# ---- 4. Megatron -------------------------------------------------------------------------


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


# ---- 6. State ----------------------------------------------------------------------------


def _state(ctx: Rank) -> list[dict[str, Any]]:
    from datetime import timedelta

    import torch
    from torch.distributed import distributed_c10d as c10d

    dist, active = gated.start(ctx, timeout=77 * 60)  # init_process_group(timeout=77 minutes)
    gated.world_in_cycle(active)  # registered without a timeout, as the README says
    group = dist.new_group([0, 1], timeout=timedelta(seconds=77), group_desc="x")
    cpu_only = dist.new_group([0, 1], backend="cpu:gloo")
    gated.reloadable(active, group, cpu_only)
    cpu = torch.device("cpu")
    reports = []
    for stage in gated.stages(active):
        native = gated.unwrap(group) if active else group
        world = c10d._get_default_group()
        reports.append(
            {
                "stage": stage,
                "world timeout": world._get_backend(cpu).options._timeout,
                "group timeout": native._get_backend(cpu).options._timeout,
                "group_desc": native.group_desc,
                "backend config": str(
                    c10d._world.pg_backend_config[gated.unwrap(cpu_only) if active else cpu_only]
                ),
            }
        )
        t = torch.ones(1)
        dist.all_reduce(t, group=group)
        assert t.item() == 2.0, stage
    return reports


@gated.GATES
def test_reload_replays_timeout_description_and_backend(env) -> None:
    """A group comes back with everything it was created with: its timeout (torch keeps it in
    the backend's options), ``group_desc`` and backend; WORLD registered without a timeout
    comes back with the 77 minutes of its ``init_process_group``, not torch's default."""
    from datetime import timedelta

    for reports in run_ranks(_state, 2, env=env, timeout=gated.RANK_TIMEOUT):
        assert len(reports) == gated.CYCLES + 1
        for report in reports:
            assert report["world timeout"] == timedelta(minutes=77), report
            assert report["group timeout"] == timedelta(seconds=77), report
            assert report["group_desc"] == "x", report
            assert report["backend config"] == "cpu:gloo", report


# ---- 7. Pickle and copy ------------------------------------------------------------------


def _pickles(ctx: Rank, names: tuple[str, ...] = ()) -> dict[str, Any]:
    import pickle

    dist, active = gated.start(ctx)
    if active:
        import reloadpg_autopatch as rpg

        rpg.set_wrap_policy("all")
        group = dist.new_group([0, 1])
        gated.reloadable(active, group)
        marked = [
            n for n, v in vars(dist).items() if callable(v) and hasattr(v, "__reloadpg_autopatch__")
        ]
        names = tuple(sorted({*names, *marked}))
    failures: dict[str, list[str]] = {}  # name -> what went wrong, one entry per stage
    for stage in gated.stages(active):
        for name in names:
            obj = getattr(dist, name)
            try:
                if pickle.loads(pickle.dumps(obj)) is not obj:  # noqa: S301 - our own bytes
                    failures.setdefault(name, []).append(f"{stage}: round trip gave another")
            except Exception as error:
                failures.setdefault(name, []).append(f"{stage}: {type(error).__name__}: {error}")
    return {"names": names, "failures": failures}


def test_wrappers_pickle_by_reference_like_torchs_own() -> None:
    """pickle finds a function by ``__module__`` + ``__qualname__``: every patched callable in
    the ``torch.distributed`` namespace (``all_reduce``, ``new_subgroups``, ``P2POp``, ...) must
    round-trip to the very same object, as torch's own do with the gate off."""
    must = ("all_reduce", "new_subgroups", "P2POp")
    ours = run_ranks(
        functools.partial(_pickles, names=must), 2, env=gated.ON, timeout=gated.RANK_TIMEOUT
    )
    names = ours[0]["names"]
    assert set(must) <= set(names), names
    assert len(names) > len(must), names
    control = run_ranks(
        functools.partial(_pickles, names=names), 2, env=gated.OFF, timeout=gated.RANK_TIMEOUT
    )
    for report in control:
        assert report["failures"] == {}, "torch's own callables must pickle: revisit the control"
    for report in ours:  # one line per callable: how many stages failed, and the first error
        lines = [
            f"{name} ({len(errors)}x): {errors[0]}" for name, errors in report["failures"].items()
        ]
        assert not lines, "\n".join(lines)


def _copies(ctx: Rank) -> list[bool]:
    import copy

    import torch

    dist, active = gated.start(ctx)
    import reloadpg_autopatch as rpg

    rpg.set_wrap_policy("all")
    group = dist.new_group([0, 1])
    gated.reloadable(active, group)
    config = {"group": group, "weights": torch.ones(2)}
    seen = []
    for _stage in gated.stages(active):
        seen.append(copy.copy(group) is group)
        seen.append(copy.deepcopy(group) is group)
        seen.append(copy.deepcopy(config)["group"] is group)
        rpg.destroy_process_groups()  # while destroyed too
        seen.append(copy.copy(group) is group and copy.deepcopy(group) is group)
        rpg.reload_process_groups()
    return seen


def test_copy_and_deepcopy_of_a_reloadable_group_give_the_group_itself() -> None:
    """Megatron deep-copies configs that hold groups; a reloadable group is a handle, so
    ``copy.copy``/``copy.deepcopy`` return it unchanged (as the package documents; torch's
    native ``ProcessGroup`` cannot be copied at all), whether live or destroyed."""
    for seen in run_ranks(_copies, 2, env=gated.ON, timeout=gated.RANK_TIMEOUT):
        assert len(seen) == 4 * (gated.CYCLES + 1)
        assert all(seen), seen


def _compiled_after_a_late_patch(ctx: Rank) -> list[str]:
    import torch
    import torch._dynamo
    import torch.distributed._functional_collectives  # Dynamo's table, built now

    import reloadpg_autopatch as rpg

    rpg.monkey_patch_torch_dist()  # late, as slime patches: the table holds torch's originals
    rpg.set_wrap_policy("all")
    ctx.init()
    import torch.distributed as dist

    problems = []
    for label, group in {"world": None, "reloadable": dist.new_group([0, 1])}.items():
        torch._dynamo.reset()
        recorder = _Recorder()
        function = torch.compile(
            _cases(group, [0, 1], ctx.rank)["all_reduce"], backend=recorder, fullgraph=True
        )
        value = _run_compiled(function, ctx.rank)
        want = _expect("all_reduce", ctx.rank, [0, 1])
        if value != want or len(recorder.graphs) != 1 or not recorder.functional():
            problems.append(f"{label}: {value}, graphs {recorder.graphs}")
    return problems


def test_compiled_collectives_after_a_late_patch() -> None:
    """Patched after ``_functional_collectives`` was imported (gate off, an explicit call),
    Dynamo's remap table was built from torch's originals: ``all_reduce`` must still compile
    into one graph with a functional collective, on WORLD and on a reloadable group."""
    _assert_no_problems(
        run_ranks(_compiled_after_a_late_patch, 2, env=gated.OFF, timeout=gated.RANK_TIMEOUT)
    )
