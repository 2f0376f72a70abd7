"""What runs around a step: the reload hooks, Megatron's releases, memory pools.

Reload hooks run in order, with their arguments, every cycle, until removed, and a failing hook
is reported; they see WORLD first; in native mode they get torch's own groups and the guard
checks each group inside the reload; a hook that calls the step is told it re-entered; a pool
deregistered and registered again comes back at the next reload; the report's freed bytes are
the difference of the figures they are made from. Megatron's releases run before a destroy
frees or suspends any communicator: megatron-core 0.19.2's ``nccl_ep_finalize()`` and
Megatron-LM main's teardown registry, in Megatron's order, a failure keeping every group.

Every rank is activated by the gate alone, on real gloo, with the real megatron-core of the
lane. The oracles are outside the package: the hooks' own records, a spy in place of the real
module's ``nccl_ep_finalize`` that runs a collective on the expert-parallel group, Megatron's
own getters, a memory probe whose figures the test chooses, torch's results, and the errors
raised.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.support import guard_ranks, memory_probes, this_tree, world_ranks
from tests.support.ranks import GATE, Rank, run_ranks, total

pytestmark = pytest.mark.timeout(300)


def _reconfigures() -> bool:
    import torch.distributed as dist

    return hasattr(dist.ProcessGroup, "reconfigure")


needs_reconfigure = pytest.mark.skipif(
    not _reconfigures(), reason="native mode needs torch 2.14's ProcessGroup.reconfigure"
)


# ---- reload hooks ------------------------------------------------------------------------


class _Recorder:
    """A hook pair that logs each call with the ids of the groups it got."""

    def __init__(self, label: str, events: list, check: Any = None) -> None:
        self.label, self.events, self.check = label, events, check

    def before_destroy(self, groups: list) -> None:
        self.events.append((self.label, "before_destroy", [id(g) for g in groups]))
        if self.check is not None:
            self.events.append((self.label, "before_destroy:sums", self.check(groups)))

    def after_reload(self, groups: list) -> None:
        self.events.append((self.label, "after_reload", [id(g) for g in groups]))
        if self.check is not None:
            self.events.append((self.label, "after_reload:sums", self.check(groups)))


def _hooks(ctx: Rank) -> dict:
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    guard_ranks.begin(ctx)
    rpg.register_default_process_group(guard_ranks.TIMEOUT, accelerator_backends=("gloo",))
    world = dist.group.WORLD
    a, b, c = (dist.new_group([0, 1]) for _ in range(3))
    ids = {"world": id(world), "a": id(a), "b": id(b), "c": id(c)}
    out: dict[str, Any] = {"ids": ids, "world_type": type(world).__name__}

    type_errors = []
    for kwargs in ({}, {"before_destroy": 42}, {"after_reload": "not callable"}):
        try:
            rpg.add_reload_hook(**kwargs)
            type_errors.append("no error")
        except TypeError:
            type_errors.append("TypeError")
    out["type_errors"] = type_errors

    events: list = []
    # Collectives inside the hooks: before a destroy every group still works, after a reload
    # every group already does.
    first = _Recorder("first", events, check=lambda groups: [total(g, 1.0) for g in groups])
    second = _Recorder("second", events)
    first_handle = rpg.add_reload_hook(
        before_destroy=first.before_destroy, after_reload=first.after_reload, name="first"
    )
    rpg.add_reload_hook(
        before_destroy=second.before_destroy, after_reload=second.after_reload, name="second"
    )
    cycles = []
    for cycle in range(3):
        if cycle == 1:
            dist.destroy_process_group(c)  # let go of on every rank: no longer the hooks' concern
        start = len(events)
        rpg.destroy_process_groups()
        rpg.destroy_process_groups()  # a second destroy in a row does nothing
        destroyed = len(events)
        rpg.reload_process_groups()
        rpg.reload_process_groups()
        cycles.append(
            {
                "destroy": events[start:destroyed],
                "reload": events[destroyed:],
                "sums": [total(g, ctx.rank + 1) for g in (world, a, b)],
            }
        )
    out["cycles"] = cycles

    first_handle.remove()
    first_handle.remove()  # idempotent
    start = len(events)
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    out["after_remove"] = [(label, phase) for label, phase, *_ in events[start:]]

    # A failing hook (on rank 0 only): the step completes, the later hook still runs, and the
    # step raises ReloadHookError naming the hook, caused by its own error.
    raised: list[BaseException] = []
    later: list[str] = []

    def before_boom(groups: list) -> None:
        if ctx.rank == 0:
            raised.append(ValueError("boom before"))
            raise raised[-1]

    def after_boom(groups: list) -> None:
        if ctx.rank == 0:
            raised.append(KeyError("boom after"))
            raise raised[-1]

    boom = rpg.add_reload_hook(before_destroy=before_boom, name="boom-before")
    late = rpg.add_reload_hook(
        before_destroy=lambda groups: later.append("before_destroy"),
        after_reload=lambda groups: later.append("after_reload"),
        name="late",
    )

    def outcome(call: Any) -> dict:
        try:
            call()
            return {"raised": None}
        except Exception as error:
            return {
                "raised": type(error).__name__,
                "hook_error": isinstance(error, rpg.ReloadHookError),
                "runtime_error": isinstance(error, RuntimeError),
                "message": str(error),
                "cause_is_hooks": bool(raised) and error.__cause__ is raised[-1],
            }

    out["failing_before"] = outcome(rpg.destroy_process_groups)
    out["failing_before_later"] = list(later)
    try:  # the destroy completed on this rank: the group has no communicator now
        total(a, 1.0)
        out["destroyed_after_failure"] = False
    except RuntimeError:
        out["destroyed_after_failure"] = True
    before_again = len(later)
    rpg.destroy_process_groups()  # in a row: no hook runs again
    out["second_destroy_hooks"] = len(later) - before_again
    boom.remove()
    rpg.reload_process_groups()
    out["after_failed_destroy_sums"] = [total(g, ctx.rank + 1) for g in (world, a, b)]

    later.clear()
    late.remove()
    rpg.add_reload_hook(after_reload=after_boom)  # named by its __qualname__
    late = rpg.add_reload_hook(
        before_destroy=lambda groups: later.append("before_destroy"),
        after_reload=lambda groups: later.append("after_reload"),
        name="late",
    )
    rpg.destroy_process_groups()
    out["failing_after"] = outcome(rpg.reload_process_groups)
    out["failing_after_later"] = list(later)
    out["after_failed_reload_sums"] = [total(g, ctx.rank + 1) for g in (world, a, b)]
    out["after_boom_qualname"] = after_boom.__qualname__
    late.remove()
    return out


def test_reload_hooks_order_arguments_cycles_removal_and_failures() -> None:
    reports = run_ranks(_hooks, 2, timeout=120, env=GATE)
    for rank, report in enumerate(reports):
        ids = report["ids"]
        assert report["world_type"] == "ReloadableProcessGroup"
        assert report["type_errors"] == ["TypeError"] * 3

        for cycle, seen in enumerate(report["cycles"]):
            held = ["a", "b"] if cycle else ["a", "b", "c"]
            expected = {ids["world"], *(ids[k] for k in held)}
            for phase, step in (("before_destroy", "destroy"), ("after_reload", "reload")):
                calls = [e for e in seen[step] if e[1] == phase]
                # Once per effective step (not for the second call in a row), in registration
                # order, each hook given the same groups.
                assert [label for label, *_ in calls] == ["first", "second"], seen[step]
                for _, _, got in calls:
                    assert len(got) == len(set(got)) == len(expected), (cycle, phase, got, ids)
                    assert set(got) == expected, (cycle, phase, got, ids)
                    mine = [g for g in got if g != ids["world"]]
                    assert mine == [ids[k] for k in held], (cycle, phase, got)  # creation order
                sums = [e for e in seen[step] if e[1] == f"{phase}:sums"]
                assert [s[2] for s in sums] == [[2.0] * len(expected)], (cycle, phase, sums)
                assert len(seen[step]) == 3, seen[step]  # nothing else ran
            assert seen["sums"] == [3.0, 3.0, 3.0]

        assert report["after_remove"] == [("second", "before_destroy"), ("second", "after_reload")]

        failing = report["failing_before"]
        assert report["failing_before_later"] == ["before_destroy"]  # the later hook ran
        assert report["destroyed_after_failure"]
        assert report["second_destroy_hooks"] == 0
        assert report["after_failed_destroy_sums"] == [3.0, 3.0, 3.0]
        failing_after = report["failing_after"]
        assert report["failing_after_later"] == ["before_destroy", "after_reload"]
        assert report["after_failed_reload_sums"] == [3.0, 3.0, 3.0]
        if rank == 1:  # its hooks did not fail
            assert failing == {"raised": None}
            assert failing_after == {"raised": None}
            continue
        for seen_error, name, phase in (
            (failing, "boom-before", "before_destroy"),
            (failing_after, report["after_boom_qualname"], "after_reload"),
        ):
            assert seen_error["raised"] == "ReloadHookError", seen_error
            assert seen_error["hook_error"], seen_error
            assert seen_error["runtime_error"], seen_error
            assert name in seen_error["message"], seen_error
            assert phase in seen_error["message"], seen_error
            assert seen_error["cause_is_hooks"], seen_error
        assert "boom before" in failing["message"]
        assert "boom after" in failing_after["message"]


def _native(ctx: Rank) -> dict:
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    guard_ranks.begin(ctx)
    groups = [dist.new_group([0, 1]) for _ in range(3)]
    events: list = []
    rec = _Recorder("hook", events)
    rpg.add_reload_hook(before_destroy=rec.before_destroy, after_reload=rec.after_reload)
    cycles = []
    with memory_probes.GcRuns() as gc_runs:
        probe = memory_probes.TimelineProbe(gc_runs, free_gib=1.0)
        probe.install()
        for _ in range(2):
            start = len(events)
            destroy_mark = probe.mark()
            rpg.destroy_process_groups()
            in_destroy = probe.since(destroy_mark)
            reload_mark = probe.mark()
            rpg.reload_process_groups()
            in_reload = probe.since(reload_mark)
            use_mark = probe.mark()
            sums = [total(g, ctx.rank + 1) for g in groups for _ in range(2)]
            cycles.append(
                {
                    "destroy": in_destroy,
                    "reload": in_reload,
                    "use": probe.since(use_mark),
                    "sums": sums,
                    "events": events[start:],
                }
            )
    return {
        "types": sorted({type(g).__name__ for g in groups}),
        "ids": [id(g) for g in groups],
        "cycles": cycles,
    }


@needs_reconfigure
def test_native_mode_guards_each_group_inside_reload_and_hooks_get_torchs_groups() -> None:
    reports = run_ranks(_native, 2, timeout=120, env={**GATE, "SLIME_RELOADABLE_PG_MODE": "native"})
    for report in reports:
        assert report["types"] == ["ProcessGroup"]
        for cycle in report["cycles"]:
            assert cycle["sums"] == [3.0] * 6
            # Once per group right before its rebuild (the report may ask the probe too).
            assert cycle["reload"]["clear"] == 3, cycle
            assert cycle["reload"]["probe"] >= 3, cycle
            assert cycle["reload"]["gc"] >= 3, cycle
            assert cycle["destroy"]["clear"] == 0, cycle
            assert cycle["use"] == {"probe": 0, "clear": 0, "gc": 0}, cycle
            assert [(label, phase) for label, phase, _ in cycle["events"]] == [
                ("hook", "before_destroy"),
                ("hook", "after_reload"),
            ], cycle
            for _, _, got in cycle["events"]:
                assert got == report["ids"], cycle  # torch's own objects, in creation order


GiB = 2**30
MiB = 2**20


# ---- hooks see WORLD first; a pool registered again comes back; freed bytes -------------------


def _hooks_pools_report(ctx: Rank) -> dict:
    import torch

    calls: list[tuple[str, Any, Any]] = []

    def register_mem_pool(self: Any, pool: Any, symm: bool = False) -> None:
        calls.append(("register", self, pool))

    def deregister_mem_pool(self: Any, pool: Any) -> None:
        calls.append(("deregister", self, pool))

    import torch.distributed as dist

    # gloo has no memory pools: a stand-in that logs, set before any group exists.
    dist.ProcessGroupGloo.register_mem_pool = register_mem_pool
    dist.ProcessGroupGloo.deregister_mem_pool = deregister_mem_pool
    rpg, dist = this_tree.begin(ctx, world=True)
    probe = memory_probes.EventProbe(free=10 * GiB)
    probe.step = 3 * MiB + 7  # every reading is larger than the one before: memory was freed
    probe.install()
    a, b = dist.new_group([0, 1]), dist.new_group([0, 1])
    seen: list[list[str]] = []
    marks: list[int] = []  # how many readings the probe had given when the hooks ran

    def before_destroy(groups: list) -> None:
        names = {id(dist.group.WORLD): "WORLD", id(a): "a", id(b): "b"}
        seen.append([names.get(id(g), repr(g)) for g in groups])
        marks.append(len(probe.returned))

    rpg.add_reload_hook(before_destroy=before_destroy, name="who")
    out: dict[str, Any] = {"hooks": seen}

    cpu = torch.device("cpu")
    pool = object()
    a._get_backend(cpu).register_mem_pool(pool)
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    # Between reloads the program deregisters the pool and registers it again.
    backend = a._get_backend(cpu)
    backend.deregister_mem_pool(pool)
    backend.register_mem_pool(pool)
    rpg.destroy_process_groups()
    del calls[:]
    rpg.reload_process_groups()
    new = a._get_backend(cpu)
    out["pool_at_next_reload"] = [(op, b_ is new, p is pool) for op, b_, p in calls]
    out["new_backend"] = new is not backend
    out["sums"] = [total(a, 1.0), total(b, 1.0), total(None, 1.0)]

    report = rpg.last_cycle_report()
    before, after = report.memory["before_destroy"], report.memory["after_destroy"]
    out["freed"] = {
        "freed_bytes": report.freed_bytes,
        "before": list(before) if before is not None else None,
        "after": list(after) if after is not None else None,
        "returned": [list(f) for f in probe.returned],
        "hooks_at": marks[-1],
    }
    return out


@pytest.fixture(scope="module")
def hooks_pools_reports() -> list[dict]:
    return run_ranks(_hooks_pools_report, 2, timeout=200, env=GATE)


def test_p5_before_destroy_hooks_receive_world_first(hooks_pools_reports) -> None:
    for report in hooks_pools_reports:
        assert report["sums"] == [2.0, 2.0, 2.0], report
        assert report["hooks"] == [["WORLD", "a", "b"]] * 2, report["hooks"]


def test_p5_a_pool_deregistered_and_registered_again_comes_back_at_the_next_reload(
    hooks_pools_reports,
) -> None:
    for report in hooks_pools_reports:
        assert report["new_backend"], report
        assert report["pool_at_next_reload"] == [("register", True, True)], report


def test_p5_freed_bytes_is_the_difference_of_the_figures_it_is_made_from(
    hooks_pools_reports,
) -> None:
    for report in hooks_pools_reports:
        freed = report["freed"]
        before, after, returned = freed["before"], freed["after"], freed["returned"]
        # Both figures are readings of the test's probe, the later one after the earlier one.
        assert before in returned, freed
        assert after in returned, freed
        assert returned.index(after) > returned.index(before), freed
        # Before the hooks and the destroy, and after them: nothing is freed in between.
        assert returned.index(before) < freed["hooks_at"] <= returned.index(after), freed
        free = 0  # MemoryFigures(free, total, allocated, reserved)
        assert after[free] > before[free], freed
        assert freed["freed_bytes"] == after[free] - before[free], freed


# ---- Megatron's releases: nccl_ep_finalize -------------------------------------------------------


CYCLES = 3


def _start(ctx: Rank) -> tuple[Any, Any, Any, Any]:
    import warnings

    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    import reloadpg_autopatch as rpg

    warnings.simplefilter("ignore")
    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    ctx.init(timeout=30.0)
    rpg.register_default_process_group(accelerator_backends=("gloo",))
    ps.initialize_model_parallel(expert_model_parallel_size=2)
    return torch, dist, ps, rpg


def _spy_on_finalize(ctx: Rank) -> dict[str, Any]:
    """The real fused_a2a module's ``nccl_ep_finalize`` replaced by a spy, three cycles."""
    torch, dist, ps, rpg = _start(ctx)
    from megatron.core.transformer.moe import fused_a2a

    ep = ps.get_expert_model_parallel_group()
    calls: list[float] = []
    entered: list[int] = []  # counted before the collective, which refuses while asleep

    def nccl_ep_finalize() -> None:  # the program's replacement: looked up at each destroy
        entered.append(len(entered))
        t = torch.tensor([1.0])
        dist.all_reduce(t, group=ep)  # the EP group still communicates
        calls.append(t.item())

    real = getattr(fused_a2a, "nccl_ep_finalize", None)
    fused_a2a.nccl_ep_finalize = nccl_ep_finalize
    getters = {
        "ep": ps.get_expert_model_parallel_group,
        "tp": ps.get_tensor_model_parallel_group,
        "dp": ps.get_data_parallel_group,
    }
    before = {name: get() for name, get in getters.items()}
    per_cycle, sums, replaced, asleep = [], [], [], []
    for cycle in range(CYCLES):
        if cycle == CYCLES - 1:  # replaced again: each destroy looks it up anew

            def replacement() -> None:
                nccl_ep_finalize()
                replaced.append(len(calls))

            fused_a2a.nccl_ep_finalize = replacement
        rpg.destroy_process_groups()
        per_cycle.append(len(calls))
        if cycle == 0:  # a destroy while asleep frees only the group made since: no release
            dist.new_group([0, 1])
            rpg.destroy_process_groups()
            asleep.append(len(entered))
        rpg.reload_process_groups()
        t = torch.tensor([1.0])
        dist.all_reduce(t, group=ep)
        sums.append(t.item())
    report = rpg.last_cycle_report().destroy.releases
    from reloadpg_autopatch.tools import doctor

    lines = doctor.render(doctor.diagnose()).splitlines()
    return {
        "doctor": [line.strip() for line in lines if line.strip().startswith("releases")],
        "asleep": asleep,
        "entered": len(entered),
        "replaced": replaced,
        "real": real is not None,
        "per_cycle": per_cycle,
        "calls": calls,
        "same": {name: get() is before[name] for name, get in getters.items()},
        "sums": sums,
        "report": [(r["name"], r["stage"], r["error"]) for r in report],
    }


@pytest.mark.timeout(240)
def test_megatrons_nccl_ep_finalize_runs_once_per_destroy_before_any_free() -> None:
    """The spy runs once per destroy, and its collective on the EP group (2 ranks) gives 2.0:
    it ran before that group's communicator was freed; a destroy while asleep (a group made
    since) runs no release, and the doctor names the function as what a destroy releases.
    After every reload Megatron's getters return the very groups they returned before, and the
    EP group works. The 0.19.2 lane has the real function the spy replaces; 0.16.1 has none,
    and the program's own is run."""
    from importlib.metadata import version

    for rank, out in enumerate(run_ranks(_spy_on_finalize, 2, timeout=120, env=GATE)):
        assert out["per_cycle"] == list(range(1, CYCLES + 1)), (rank, out)
        assert out["calls"] == [2.0] * CYCLES, (rank, out)
        assert all(out["same"].values()), (rank, out["same"])
        assert out["sums"] == [2.0] * CYCLES, (rank, out)
        name = "megatron.core.transformer.moe.fused_a2a.nccl_ep_finalize"
        assert out["report"] == [(name, "RELEASE_COMMUNICATION", None)], (rank, out["report"])
        assert out["replaced"] == [CYCLES], (rank, out["replaced"])  # looked up at the destroy
        assert out["asleep"] == [1], (rank, out["asleep"])  # none at the destroy while asleep
        assert out["entered"] == CYCLES, (rank, out["entered"])
        (line,) = out["doctor"]
        assert "fused_a2a.nccl_ep_finalize()" in line, line  # what the next destroy releases
        assert "none found" not in line, line
        if version("megatron-core") >= "0.19":
            assert out["real"], "megatron-core 0.19.2 has fused_a2a.nccl_ep_finalize"


# ---- Megatron-LM main's registry ---------------------------------------------------------------


def _install_registry(ps: Any) -> None:
    """Megatron-LM main's teardown registry, on the real parallel_state module.

    No megatron-core release on the package index has it yet (0.19.2 is the newest), so it is
    written here from Megatron-LM main's names and tests: ``TeardownStage`` with VALIDATE,
    RELEASE_COMMUNICATION, RELEASE_CUDA_GRAPHS and RESET_STATE, callbacks kept per stage in
    ``_MODEL_PARALLEL_TEARDOWN_CALLBACKS`` in registration order, each callback once per stage.
    """
    import enum

    class TeardownStage(enum.Enum):
        VALIDATE = "validate"
        RELEASE_COMMUNICATION = "release_communication"
        RELEASE_CUDA_GRAPHS = "release_cuda_graphs"
        RESET_STATE = "reset_state"

    callbacks: dict[Any, list[Any]] = {stage: [] for stage in TeardownStage}

    def register_model_parallel_teardown(stage: Any, callback: Any, on_abort: Any = None) -> None:
        if callback not in callbacks[stage]:
            callbacks[stage].append(callback)

    ps.TeardownStage = TeardownStage
    ps._MODEL_PARALLEL_TEARDOWN_CALLBACKS = callbacks
    ps.register_model_parallel_teardown = register_model_parallel_teardown


def _registry(ctx: Rank) -> dict[str, Any]:
    """Callbacks registered out of stage order (as Megatron-LM main's own test does), and on
    rank 1 a release of communication that raises in the second destroy."""
    torch, dist, ps, rpg = _start(ctx)
    from megatron.core.transformer.moe import fused_a2a

    _install_registry(ps)
    stage = ps.TeardownStage
    events: list[str] = []
    ep = ps.get_expert_model_parallel_group()
    failing = {"on": False}

    def recorder(name: str) -> Any:
        def release() -> None:
            t = torch.tensor([1.0])
            dist.all_reduce(t, group=ep)  # every group still communicates
            events.append(f"{name}:{t.item():g}")

        release.__qualname__ = f"release_{name}"
        return release

    def finalize_nccl_ep() -> None:
        events.append("ep_finalize")
        if failing["on"] and ctx.rank == 1:
            raise RuntimeError("injected EP finalization failure")

    fused_a2a.nccl_ep_finalize = lambda: events.append("fused_a2a looked up")
    ps.register_model_parallel_teardown(stage.RESET_STATE, recorder("te_state"))
    ps.register_model_parallel_teardown(stage.RELEASE_CUDA_GRAPHS, recorder("graphs"))
    ps.register_model_parallel_teardown(stage.RELEASE_COMMUNICATION, recorder("a2a_buffers"))
    symm = recorder("symm_buffers")
    for _ in range(2):
        ps.register_model_parallel_teardown(stage.RELEASE_COMMUNICATION, symm)
    ps.register_model_parallel_teardown(stage.VALIDATE, recorder("validate"))

    rpg.destroy_process_groups()
    first = list(events)
    report = [
        (r["stage"], r["name"].rsplit(".", 1)[-1]) for r in rpg.last_cycle_report().destroy.releases
    ]
    rpg.reload_process_groups()

    ps.register_model_parallel_teardown(stage.RELEASE_COMMUNICATION, finalize_nccl_ep)
    failing["on"] = True
    events.clear()
    try:
        rpg.destroy_process_groups()
        refused = ("returned", "")
    except rpg.ReloadPGError as error:
        refused = (type(error).__name__, str(error))
    second = list(events)
    live = []
    for get in (ps.get_expert_model_parallel_group, ps.get_data_parallel_group):
        t = torch.tensor([1.0])
        dist.all_reduce(t, group=get())  # nothing was freed: every group still works
        live.append(t.item())
    failing["on"] = False
    rpg.destroy_process_groups()  # the next cycle goes through
    rpg.reload_process_groups()
    from reloadpg_autopatch.tools import doctor

    lines = doctor.render(doctor.diagnose()).splitlines()
    return {
        "first": first,
        "report": report,
        "refused": refused,
        "second": second,
        "live": live,
        "doctor": [line.strip() for line in lines if line.strip().startswith("releases")],
    }


@pytest.mark.timeout(240)
def test_the_registrys_releases_run_in_megatrons_order_and_a_failure_keeps_every_group() -> None:
    """With Megatron-LM main's registry, a destroy runs the RELEASE_COMMUNICATION callbacks,
    then the RELEASE_CUDA_GRAPHS ones, each stage's later registration first and each
    callback once (never VALIDATE or RESET_STATE, and not fused_a2a's own function, which the
    registry holds where Megatron has it), while every group still communicates; the report
    lists them. A release raising on rank 1: the other releases still run, every rank raises
    ``ReleaseError`` naming the callback and the rank, nothing was freed (every group works),
    and the next cycle goes through. The doctor counts the registry's releases per stage."""
    for rank, out in enumerate(run_ranks(_registry, 2, timeout=120, env=GATE)):
        assert out["first"] == ["symm_buffers:2", "a2a_buffers:2", "graphs:2"], (rank, out)
        assert out["report"] == [
            ("RELEASE_COMMUNICATION", "release_symm_buffers"),
            ("RELEASE_COMMUNICATION", "release_a2a_buffers"),
            ("RELEASE_CUDA_GRAPHS", "release_graphs"),
        ], (rank, out["report"])
        kind, message = out["refused"]
        assert kind == "ReleaseError", (rank, out["refused"])
        assert "finalize_nccl_ep" in message, (rank, message)
        assert "on rank 1:" in message, (rank, message)
        assert "injected EP finalization failure" in message, (rank, message)
        want = ["ep_finalize", "symm_buffers:2", "a2a_buffers:2", "graphs:2"]
        assert out["second"] == want, (rank, out["second"])
        assert out["live"] == [2.0, 2.0], (rank, out["live"])
        (line,) = out["doctor"]  # the registry's stages counted, each callback once
        assert "teardown registry: RELEASE_COMMUNICATION 3, RELEASE_CUDA_GRAPHS 1" in line, line


# ---- a hook that re-enters the step ----------------------------------------------------------

REENTRY = re.compile(r"re-?ent|reentr|inside a reload hook|from a reload hook|same thread", re.I)


def _reentering_hooks(ctx: Rank) -> dict:
    import reloadpg_autopatch as rpg

    dist = world_ranks.begin(ctx)
    group = dist.new_group([0])

    def destroys(groups: list[Any]) -> None:
        rpg.destroy_process_groups()

    def reloads(groups: list[Any]) -> None:
        rpg.reload_process_groups()

    handles = [
        rpg.add_reload_hook(before_destroy=destroys, name="calls destroy"),
        rpg.add_reload_hook(after_reload=reloads, name="calls reload"),
    ]
    out: dict[str, Any] = {}
    for step, call in (
        ("destroy", rpg.destroy_process_groups),
        ("reload", rpg.reload_process_groups),
    ):
        try:
            call()
            out[step] = {"error": None}
        except Exception as error:
            cause = error.__cause__
            out[step] = {
                "error": world_ranks.error_text(error),
                "hook_error": isinstance(error, rpg.ReloadHookError),
                "cause": None if cause is None else world_ranks.error_text(cause),
            }
    for handle in handles:
        handle.remove()
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    out["sum"] = total(group, 1.0)
    return out


def test_a_hook_that_calls_the_step_is_told_it_re_entered() -> None:
    """A ``before_destroy`` hook calling ``destroy_process_groups()`` and an ``after_reload``
    hook calling ``reload_process_groups()``: each step raises ``ReloadHookError`` whose cause
    says the step was re-entered from a hook, not that another thread runs it."""
    (report,) = run_ranks(_reentering_hooks, 1, timeout=90, env=GATE)
    for step in ("destroy", "reload"):
        outcome = report[step]
        assert outcome["error"] is not None, (step, outcome)
        assert outcome["hook_error"], (step, outcome)
        cause = outcome["cause"]
        assert cause is not None, (step, outcome)
        assert REENTRY.search(cause), (step, cause)
        assert "another thread" not in cause, (step, cause)
    assert report["sum"] == 1.0, report
