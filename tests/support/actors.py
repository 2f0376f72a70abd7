"""What the tests of the framework actors share (``tests/support/frameworks``).

The actor's arguments and WORLD's address in the environment, as Ray's actor has them; a WORLD
backend that holds "accelerator" memory on CPU, which the package swaps as it swaps an NCCL
WORLD; the training steps each program runs and what they give; a probe showing that a
collective on a destroyed group never runs on WORLD; and the doctor's lines on adoption.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

from tests.support.ranks import Rank

#: Steps each program runs (two destroy/reload pairs each, after the first destroy of init).
STEPS = 2
#: Destroys and reloads the package sees: init's sleep, then two of each per step.
DESTROYS, RELOADS = 1 + 2 * STEPS, 2 * STEPS
#: A WORLD backend that holds "accelerator" memory on CPU: a gloo leg for the CPU and, for the
#: cuda device, a backend torch is told serves only cuda, as it is told of NCCL. The package
#: swaps such a WORLD for a temporary gloo WORLD on destroy, as it swaps an NCCL WORLD.
ACCEL_LEG = "cpuaccel"
ACCEL_WORLD = f"cpu:gloo,cuda:{ACCEL_LEG}"


def args(ctx: Rank, backend: str = "gloo") -> SimpleNamespace:
    """The actor's arguments, and WORLD's address in the environment, as Ray's actor has it."""
    os.environ.update(
        MASTER_ADDR=ctx.host,
        MASTER_PORT=str(ctx.port),
        RANK=str(ctx.rank),
        WORLD_SIZE=str(ctx.world_size),
    )
    return SimpleNamespace(
        distributed_backend=backend, distributed_timeout_minutes=1, offload_train=True
    )


def accelerator_world() -> str:
    """Register ``cpuaccel`` (a gloo backend torch is told serves only cuda); WORLD's backend."""
    import torch.distributed as dist

    def create(store: Any, rank: int, size: int, timeout: Any) -> Any:
        return dist.ProcessGroupGloo(store, rank, size, timeout)

    dist.Backend.register_backend(ACCEL_LEG, create, devices=["cuda"])
    return ACCEL_WORLD


def outcome(call: Any) -> tuple[str, Any]:
    try:
        return ("no error", call())
    except Exception as error:
        return (type(error).__name__, str(error))


def misroute(ctx: Rank, pair: Any) -> dict[str, Any]:
    """Ranks 0 and 1 run a collective on the destroyed group of ranks [0, 1]; then every rank
    sums ``rank + 1`` over WORLD. Had the first call run on WORLD, rank 2's WORLD call would
    have been its partner (ranks 0 and 1 then skip theirs, so a misroute fails fast)."""
    import torch
    import torch.distributed as dist

    out: dict[str, Any] = {}
    ran_on_world = False
    if ctx.rank in (0, 1):
        t = torch.tensor([float(ctx.rank + 1)])
        out["pair"] = outcome(lambda: dist.all_reduce(t, group=pair))
        out["tensor"] = t.item()
        ran_on_world = out["pair"][0] == "no error"
    if not ran_on_world:
        t = torch.tensor([float(ctx.rank + 1)])
        dist.all_reduce(t)
        out["world"] = t.item()
    return out


def steps(actor: Any, miles: bool = False) -> list[Any]:
    out = []
    for step in range(STEPS):
        trained = actor.train(step)
        if miles:
            actor.offload()
        out.append((trained, actor.update_weights()))
    return out


def doctor_on_adoption() -> dict[str, Any]:
    from reloadpg_autopatch.tools import doctor

    report = doctor.diagnose()
    lines = doctor.render(report).splitlines()
    return {
        "adoption": report.adoption,
        "lines": [
            line
            for line in lines
            if "adopt" in line or "lifecycle" in line or line.startswith("  left alone")
        ],
        "problems": report.problems,
    }


#: What each step gives: train sums ``rank + 1`` over every rank (6), then over [0, 1] on
#: those ranks (12); the weight transfer broadcasts rank 0's ``100``.
STEP_RESULTS = {0: (12.0, 100.0), 1: (12.0, 100.0), 2: (6.0, 100.0)}
