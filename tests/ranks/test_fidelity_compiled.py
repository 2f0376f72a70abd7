"""Fidelity under Dynamo: compiled code cannot tell our groups and wrappers from native ones.

Each collective Dynamo remaps compiles with ``fullgraph=True`` on every kind of group, as torch
compiles it on WORLD and a native group; P2P compiles into one graph where torch enables it and
breaks the graph exactly where torch does where it does not; ``_functional_collectives`` take
reloadable groups and their names, also from a compiled call that captured them; a late patch
(after ``_functional_collectives`` was imported) still compiles into one graph.

Two gloo ranks that the gate alone activates, checked again after each cycle, with the gate-off
run of the same rank function as the control (``tests/support/gated.py``). The oracles: the
graphs Dynamo hands to a recording backend, and collective values worked out by hand.
"""

from __future__ import annotations

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


# ---- Dynamo ---------------------------------------------------------------------------


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


# ---- Functional collectives -----------------------------------------------------------


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


# ---- a late patch --------------------------------------------------------------------------------


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
