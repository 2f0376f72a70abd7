"""Step 7, ``suspend_probes``: the strict suspend mode refusing ``NCCL_CUMEM_ENABLE=0`` and
split sharing up front, then, last because it may fault the GPU, a raw collective on a
suspended communicator (what the package's guard prevents; recorded, not judged)."""

from __future__ import annotations

import contextlib
import os

from .common import GATE, MODE_ENV, error_line
from .nccl import communicators, raw_world
from .plan import Facts, Run, Step, gpu_reason
from .rank import Ctx, check, data, load_stand_in, rank_device, sync
from .workload import warm


def _plan_probes(facts: Facts) -> tuple[list[Run], str | None]:
    reason = gpu_reason(facts)
    if reason is not None:
        return [], reason
    runs = []
    refusal = facts.package_reason() or facts.torch_suspend_reason()
    if refusal is None:
        strict = {GATE: "1", MODE_ENV: "suspend"}
        for name, value in (("NCCL_CUMEM_ENABLE", "0"), ("NCCL_COMM_SPLIT_SHARE_RESOURCES", "1")):
            env = {**strict, name: value}
            runs.append(Run(f"refused with {name}={value}", "refusal", 1, 18.0, env))
    method, why = facts.suspend_method()
    if facts.rehearse:
        method = "stand-in"
    if method is not None:
        options = ("--method", method)
        runs.append(Run("a raw collective while suspended", "raw_asleep", 1, 18.0, {}, options))
    if not runs:
        return [], f"{refusal}; and for the raw collective: {why}"
    return runs, None


STEP = Step(
    "suspend_probes",
    "strict suspend refusals, then a raw collective on a suspended communicator",
    _plan_probes,
)


def _rank_refusal(ctx: Ctx) -> None:
    """In strict suspend mode, a setting that makes suspend refuse is refused up front."""
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    device = rank_device(ctx)
    if ctx.rehearse:
        stand_in = load_stand_in()
        backend, kwargs = stand_in.NAME_A, {}
    else:
        backend, kwargs = "nccl", {"device_id": device}
    dist.init_process_group(
        backend,
        init_method=ctx.init_method,
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=ctx.timeout(),
        **kwargs,
    )
    try:
        rpg.register_default_process_group()
        refused = "no error"
    except Exception as error:
        refused = error_line(error)
    data(refused=refused)
    names = [n for n in ("NCCL_CUMEM_ENABLE", "NCCL_COMM_SPLIT_SHARE_RESOURCES") if n in os.environ]
    check(
        "refused up front, naming the setting",
        refused != "no error" and all(n in refused for n in names),
        refused,
    )
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def _rank_raw_asleep(ctx: Ctx) -> None:
    """A collective on a suspended communicator: what the package's guard prevents. Last."""
    if ctx.rehearse:
        stand_in = load_stand_in()
        ctx.method = "stand-in B" if stand_in.python_backend_available() else "stand-in"
    torch, dist, device, stand_in = raw_world(ctx)
    group = dist.new_group([0])
    warm([group], ctx, device)
    comm = communicators(ctx, [group], device)[0]
    comm.suspend()
    data(outcome="started", method=ctx.method)
    try:
        t = torch.ones(8, device=device)
        dist.all_reduce(t, group=group)
        sync(device)
        data(outcome=f"returned {t[0].item()}")
    except Exception as error:
        data(outcome=error_line(error))
    check("observed (no verdict: undefined behaviour)", None, "recorded in data.outcome")
    os._exit(0)  # destroying a suspended communicator is its own question; not asked here


PROGRAMS = {"refusal": _rank_refusal, "raw_asleep": _rank_raw_asleep}
