"""Megatron's releases run before a destroy frees or suspends any communicator.

What borrows a communicator is released the way its owner releases it before the group is torn
down: megatron-core 0.19.2's ``destroy_model_parallel()`` calls
``megatron.core.transformer.moe.fused_a2a.nccl_ep_finalize()`` first (TransformerEngine's NCCL EP
borrows the expert-parallel group's communicator), and Megatron-LM main keeps a registry of
teardown stages (``parallel_state.register_model_parallel_teardown``). Every case runs on gloo
ranks the gate alone activated, with the real megatron-core of the lane (0.16.1 or 0.19.2).

The oracles are outside the package: a spy put in place of the real module's
``nccl_ep_finalize`` that counts its calls and runs a collective on Megatron's expert-parallel
group (so it ran while that group still communicated), Megatron's own getters, the events the
callbacks record, torch's results, and the error each rank raises.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.ranks import GATE, Rank, run_ranks

pytestmark = pytest.mark.timeout(240)

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

    def nccl_ep_finalize() -> None:  # the program's replacement: looked up at each destroy
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
    per_cycle, sums, replaced = [], [], []
    for cycle in range(CYCLES):
        if cycle == CYCLES - 1:  # replaced again: each destroy looks it up anew

            def replacement() -> None:
                nccl_ep_finalize()
                replaced.append(len(calls))

            fused_a2a.nccl_ep_finalize = replacement
        rpg.destroy_process_groups()
        per_cycle.append(len(calls))
        rpg.reload_process_groups()
        t = torch.tensor([1.0])
        dist.all_reduce(t, group=ep)
        sums.append(t.item())
    report = rpg.last_cycle_report().destroy.releases
    return {
        "replaced": replaced,
        "real": real is not None,
        "per_cycle": per_cycle,
        "calls": calls,
        "same": {name: get() is before[name] for name, get in getters.items()},
        "sums": sums,
        "report": [(r["name"], r["stage"], r["error"]) for r in report],
    }


def test_megatrons_nccl_ep_finalize_runs_once_per_destroy_before_any_free() -> None:
    """The spy runs once per destroy, and its collective on the EP group (2 ranks) gives 2.0:
    it ran before that group's communicator was freed. After every reload Megatron's getters
    return the very groups they returned before, and the EP group works. The 0.19.2 lane has
    the real function the spy replaces; 0.16.1 has none, and the program's own is run."""
    from importlib.metadata import version

    for rank, out in enumerate(run_ranks(_spy_on_finalize, 2, timeout=120, env=GATE)):
        assert out["per_cycle"] == list(range(1, CYCLES + 1)), (rank, out)
        assert out["calls"] == [2.0] * CYCLES, (rank, out)
        assert all(out["same"].values()), (rank, out["same"])
        assert out["sums"] == [2.0] * CYCLES, (rank, out)
        name = "megatron.core.transformer.moe.fused_a2a.nccl_ep_finalize"
        assert out["report"] == [(name, "RELEASE_COMMUNICATION", None)], (rank, out["report"])
        assert out["replaced"] == [CYCLES], (rank, out["replaced"])  # looked up at the destroy
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
    return {"first": first, "report": report, "refused": refused, "second": second, "live": live}


def test_the_registrys_releases_run_in_megatrons_order_and_a_failure_keeps_every_group() -> None:
    """With Megatron-LM main's registry, a destroy runs the RELEASE_COMMUNICATION callbacks,
    then the RELEASE_CUDA_GRAPHS ones, each stage's later registration first and each
    callback once (never VALIDATE or RESET_STATE, and not fused_a2a's own function, which the
    registry holds where Megatron has it), while every group still communicates; the report
    lists them. A release raising on rank 1: the other releases still run, every rank raises
    ``ReleaseError`` naming the callback and the rank, nothing was freed (every group works),
    and the next cycle goes through."""
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
