"""Step 5, ``package_suspend``: the package's suspend mode (torch 2.12+, NCCL 2.29.7+).

Once on ``nccl`` and once (one cycle) on ``nccl-legacy``: WORLD the same object, a collective
while asleep refused, a new group while asleep refused (its communicator would be split from
WORLD's), a gloo group awake, the report's NCCL figures, and a CUDA graph captured before the
cycles replayed after them.
"""

from __future__ import annotations

import json
import time
from typing import Any

from .common import GATE, GROUPS, MODE_ENV, GiB, MiB, error_line
from .plan import Facts, Run, Step, gpu_reason, passes
from .rank import (
    Ctx,
    activation,
    check,
    check_implementation,
    data,
    implementation_of,
    load_stand_in,
    rank_device,
    sync,
)
from .workload import correct, free_bytes, warm


def _plan_package_suspend(facts: Facts) -> tuple[list[Run], str | None]:
    reason = gpu_reason(facts) or facts.package_reason() or facts.torch_suspend_reason()
    if reason is not None:
        return [], reason
    size = 2 if facts.multi_rank() else 1
    env = {GATE: "1", MODE_ENV: "suspend"}
    if size == 2:
        env["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
    # The classic pass runs one cycle: the nccl pass measures the second.
    label = f"suspend mode, world size {size},"
    runs = passes(
        facts,
        label,
        "package_suspend",
        size,
        env=env,
        deadlines=(50.0, 30.0),
        legacy_options=("--cycles", "1"),
    )
    return runs, None


STEP = Step(
    "package_suspend",
    "the package's suspend mode on nccl and nccl-legacy: WORLD kept, the guard, no new "
    "group split from a sleeping WORLD, the report's NCCL figures",
    _plan_package_suspend,
)


def _rank_package_suspend(ctx: Ctx) -> None:
    """The package's suspend mode, activated by the gate at start-up."""
    import torch
    import torch.distributed as dist

    package = activation()
    check("activated by the gate alone", package["activated"], str(package.get("bootstrap")))
    import reloadpg_autopatch as rpg

    device = rank_device(ctx)
    stand_in = None
    if ctx.rehearse:
        stand_in = load_stand_in()
        stand_in.set_device_total(16 * GiB)  # room for the resume and the guard's 3 GiB margin
        rpg.set_memory_probe(stand_in.memory_probe, device_types=("cpu", stand_in.ACCELERATOR))
        backend, kwargs = stand_in.NAME_A, {}
    else:
        backend, kwargs = ctx.backend or "nccl", {"device_id": device}
    dist.init_process_group(
        backend,
        init_method=ctx.init_method,
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=ctx.timeout(),
        **kwargs,
    )
    data(mode=rpg.get_reload_mode(), backend=backend)
    check_implementation(ctx, implementation_of(ctx, dist.group.WORLD, device))
    rpg.register_default_process_group()
    control = dist.new_group(backend="gloo")  # left awake by the mode
    groups = [dist.new_group(list(range(ctx.world_size))) for _ in range(GROUPS)]
    world = dist.group.WORLD
    everyone = [world, *groups]
    warm(everyone, ctx, device)
    graph = _capture(ctx, torch, dist, groups[0], device)
    cycles = []
    for number in range(1, ctx.cycles + 1):
        cycle: dict[str, Any] = {"free_before": free_bytes(device, control, stand_in)}
        started = time.perf_counter()
        rpg.destroy_process_groups()
        cycle["destroy_ms"] = round((time.perf_counter() - started) * 1e3, 3)
        cycle["free_asleep"] = free_bytes(device, control, stand_in)
        cycle["world_same_object"] = dist.group.WORLD is world
        try:
            dist.all_reduce(torch.ones(8, device=device), group=groups[1])
            cycle["collective_asleep"] = "no error: THE GUARD DID NOT FIRE"
        except Exception as error:
            cycle["collective_asleep"] = error_line(error)
        c = torch.ones(4)
        dist.all_reduce(c, group=control)
        cycle["gloo_asleep"] = c.tolist()
        try:  # its communicator would be split from WORLD's, which sleeps (nccl2: at creation)
            dist.new_group(list(range(ctx.world_size)))
            cycle["new_group_asleep"] = "no error: A GROUP WAS SPLIT FROM A SLEEPING WORLD"
        except Exception as error:
            cycle["new_group_asleep"] = error_line(error)
        started = time.perf_counter()
        rpg.reload_process_groups()
        cycle["reload_ms"] = round((time.perf_counter() - started) * 1e3, 3)
        cycle["free_resumed"] = free_bytes(device, control, stand_in)
        cycle["correct_after_resume"] = correct(everyone, ctx, device)
        cycle["report"] = rpg.last_cycle_report().to_dict()
        cycles.append(cycle)
        data(cycles=cycles)
        check(f"cycle {number}: WORLD is the same object", cycle["world_same_object"], "")
        check(
            f"cycle {number}: a collective while asleep is refused",
            "GroupSuspendedError" in cycle["collective_asleep"],
            cycle["collective_asleep"],
        )
        check(
            f"cycle {number}: a gloo group works while asleep",
            cycle["gloo_asleep"] == [float(ctx.world_size)] * 4,
            str(cycle["gloo_asleep"]),
        )
        check(
            f"cycle {number}: a new group while WORLD sleeps is refused",
            "GroupSuspendedError" in cycle["new_group_asleep"]
            and "WORLD" in cycle["new_group_asleep"],
            cycle["new_group_asleep"],
        )
        check(f"cycle {number}: right results after the reload", cycle["correct_after_resume"], "")
        nccl = cycle["report"].get("nccl") or {}
        released = nccl.get("nccl_released_bytes") or nccl.get("released_bytes")
        freed = cycle["free_asleep"] - cycle["free_before"]
        check(
            f"cycle {number}: the device saw memory freed",
            freed > 0 if (released or 0) >= 2 * MiB else None,
            f"{freed / MiB:.1f} MiB (free memory), report: {json.dumps(nccl, default=str)[:300]}",
        )
    if graph is not None:
        t, replay = graph
        t.fill_(1.0)
        replay.replay()
        sync(device)
        check(
            "a CUDA graph captured before the cycles replays after them",
            bool(torch.all(t == ctx.world_size).item()),
            f"{t[:2].tolist()}",
        )
    first = cycles[0]
    data(
        summary={
            "destroy_ms": first["destroy_ms"],
            "reload_ms": first["reload_ms"],
            "freed_by_suspend_bytes": first["free_asleep"] - first["free_before"],
            "report_nccl": first["report"].get("nccl"),
        }
    )
    dist.destroy_process_group()


def _capture(ctx: Ctx, torch: Any, dist: Any, group: Any, device: Any) -> Any:
    if ctx.rehearse:
        check("a CUDA graph across the cycles", None, "skipped: the rehearsal has no CUDA")
        return None
    t = torch.ones(1024, device=device)
    stream = torch.cuda.Stream()
    try:
        dist.all_reduce(t, group=group)
        sync(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            dist.all_reduce(t, group=group)
    except Exception as error:
        check("a CUDA graph across the cycles", None, f"capture failed: {error_line(error)}")
        return None
    return t, graph


PROGRAMS = {"package_suspend": _rank_package_suspend}
