"""Step 2, ``nccl_suspend``: NCCL's own suspend and resume on the communicators torch made.

Through torch's ``Backend.suspend`` where torch has it, else through NCCL's C API with ctypes
(``nccl.py``): bytes freed per ``ncclCommMemStats`` and per ``mem_get_info``, milliseconds per
call, right results after the resume, and destroy + re-create + first collective beside it.
"""

from __future__ import annotations

import time
from typing import Any

from .common import GROUPS, MiB
from .nccl import communicators, raw_world
from .plan import Facts, Run, Step, gpu_reason
from .rank import Ctx, check, data, sync
from .workload import correct, free_bytes, time_ms, warm


def _plan_nccl_suspend(facts: Facts) -> tuple[list[Run], str | None]:
    if (reason := gpu_reason(facts)) is not None:
        return [], reason
    method, why = facts.suspend_method()
    if facts.rehearse:
        method = "stand-in"
    elif method is None:
        return [], why
    runs = [Run("world size 1", "nccl_suspend", 1, 30.0, {}, ("--method", method))]
    if facts.multi_rank():
        multi = {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}
        runs.append(Run("world size 2", "nccl_suspend", 2, 45.0, multi, ("--method", method)))
    return runs, None


STEP = Step(
    "nccl_suspend",
    "NCCL's own suspend and resume on torch's communicators, against destroy + re-create",
    _plan_nccl_suspend,
)


def _rank_nccl_suspend(ctx: Ctx) -> None:
    torch, dist, device, stand_in = raw_world(ctx)
    size = ctx.world_size
    control = dist.new_group(backend="gloo")
    groups = [dist.group.WORLD] + [dist.new_group(list(range(size))) for _ in range(GROUPS)]
    warm(groups, ctx, device)
    comms = communicators(ctx, groups, device)
    awake = [c.stats() for c in comms]
    suspendable = sum(s["suspend"] for s in awake)
    data(method=ctx.method, groups=len(groups), stats_awake=awake)
    cycles = []
    for number in range(1, 3):
        cycle: dict[str, Any] = {
            "cycle": number,
            "free_before": free_bytes(device, control, stand_in),
        }
        sync(device)
        cycle["suspend_ms"] = [time_ms(c.suspend) for c in comms]  # the same order on every rank
        cycle["free_asleep"] = free_bytes(device, control, stand_in)
        cycle["stats_asleep"] = [c.stats() for c in comms]
        cycle["resume_ms"] = [time_ms(c.resume) for c in comms]
        sync(device)
        cycle["free_resumed"] = free_bytes(device, control, stand_in)
        cycle["stats_resumed"] = [c.stats() for c in comms]
        cycle["correct_after_resume"] = correct(groups, ctx, device)
        cycles.append(cycle)
        data(cycles=cycles)
        check(
            f"cycle {number}: every communicator said suspended, then awake",
            all(s["suspended"] == 1 for s in cycle["stats_asleep"])
            and all(s["suspended"] == 0 for s in cycle["stats_resumed"]),
            f"asleep {[s['suspended'] for s in cycle['stats_asleep']]}, resumed "
            f"{[s['suspended'] for s in cycle['stats_resumed']]}",
        )
        check(f"cycle {number}: right results after the resume", cycle["correct_after_resume"], "")
        freed = cycle["free_asleep"] - cycle["free_before"]
        check(
            f"cycle {number}: the device saw memory freed",
            freed > 0 if suspendable >= 2 * MiB else None,
            f"{freed / MiB:.1f} MiB freed (mem_get_info), NCCL counts {suspendable / MiB:.1f} "
            "MiB suspendable"
            + ("" if suspendable >= 2 * MiB else ": under 2 MiB, the driver may not show it"),
        )
    # Against destroy + re-create + first collective: what the wrapper mode pays instead.
    before = free_bytes(device, control, stand_in)
    started = time.perf_counter()
    for group in groups[1:]:
        dist.destroy_process_group(group)
    sync(device)
    destroy_ms = (time.perf_counter() - started) * 1e3
    after = free_bytes(device, control, stand_in)
    started = time.perf_counter()
    fresh = [dist.new_group(list(range(size))) for _ in range(GROUPS)]
    x = torch.ones(1024, device=device)
    for group in fresh:
        dist.all_reduce(x, group=group)
    sync(device)
    recreate_ms = (time.perf_counter() - started) * 1e3
    check("right results on the re-created groups", correct(fresh, ctx, device), "")
    first = cycles[0]
    data(
        summary={
            "method": ctx.method,
            "world_size": size,
            "communicators": len(comms),
            "nccl_suspendable_bytes": suspendable,
            "nccl_persist_bytes": sum(s["persist"] for s in awake),
            "freed_by_suspend_bytes": first["free_asleep"] - first["free_before"],
            "suspend_ms": round(sum(first["suspend_ms"]), 3),
            "resume_ms": round(sum(first["resume_ms"]), 3),
            "suspend_ms_per_call": round(sum(first["suspend_ms"]) / len(comms), 3),
            "resume_ms_per_call": round(sum(first["resume_ms"]) / len(comms), 3),
            "destroy_ms": round(destroy_ms, 3),
            "freed_by_destroy_bytes": after - before,
            "recreate_first_collective_ms": round(recreate_ms, 3),
            "groups_destroyed": len(groups) - 1,
        }
    )
    dist.destroy_process_group()


PROGRAMS = {"nccl_suspend": _rank_nccl_suspend}
