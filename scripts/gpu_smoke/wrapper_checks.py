"""Step 4, ``wrapper_checks``: the wrapper mode's promises on ``nccl``, one rank, two cycles.

WORLD swapped to gloo and back, the memory guard before a reloaded group's first collective, a
CUDA memory pool registered again after each reload (``pool.py``), the cycle report's figures
against ``mem_get_info``, and the order the groups are freed in, after Megatron's releases
(``concert.py``). The same program runs ``native_nccl2``'s passes in native mode.
"""

from __future__ import annotations

import os
from typing import Any

from .common import GATE, IMPLEMENTATIONS, MODE_ENV, GiB, MiB
from .concert import check_concert, release_spy
from .native_nccl2 import checks_backend, reconfigurable, refused_in_place
from .plan import Facts, Run, Step, gpu_reason
from .pool import pool_check, pool_setup
from .rank import (
    Ctx,
    activation,
    check,
    check_implementation,
    data,
    implementation_of,
    rank_device,
    sync,
)


def _plan_wrapper_checks(facts: Facts) -> tuple[list[Run], str | None]:
    reason = gpu_reason(facts) or facts.package_reason()
    if reason is not None:
        return [], reason
    backend = "gloo" if facts.rehearse else "nccl"
    env = {GATE: "1", MODE_ENV: "wrapper"}
    return [Run(f"checks on {backend}", "checks", 1, 40.0, env, ("--backend", backend))], None


STEP = Step(
    "wrapper_checks",
    "WORLD swapped and back, the memory guard, a memory pool, the cycle report's figures",
    _plan_wrapper_checks,
)


class _PretendMemory:
    """The rehearsal's device memory for the package's probe: always low, clears counted."""

    def __init__(self) -> None:
        self.total, self.free, self.cleared = 8 * GiB, 1 * GiB, 0

    def figures(self, rank_device: Any) -> Any:
        from reloadpg_autopatch import MemoryFigures

        return MemoryFigures(self.free, self.total, 0, self.total - self.free)

    def clear(self, rank_device: Any) -> None:
        self.cleared += 1


def _rank_checks(ctx: Ctx) -> None:
    """Wrapper (or native) mode: WORLD, the guard, a memory pool and the cycle report."""
    import logging

    import torch
    import torch.distributed as dist

    package = activation()
    check("activated by the gate alone", package["activated"], str(package.get("bootstrap")))
    import reloadpg_autopatch as rpg

    device = rank_device(ctx)
    backend = checks_backend(ctx)
    dist.init_process_group(
        backend,
        init_method=ctx.init_method,
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=ctx.timeout(),
    )
    in_place_pass = os.environ.get(MODE_ENV) == "native" and ctx.backend in IMPLEMENTATIONS
    if in_place_pass:  # which implementation ran, and the refusal where it cannot rebuild
        found = implementation_of(ctx, dist.group.WORLD, device)
        check_implementation(ctx, found)
        if not reconfigurable(dist.group.WORLD):
            refused_in_place(ctx, rpg, dist, found)
            return
    pretend = _PretendMemory() if ctx.rehearse else None
    if pretend is not None:
        rpg.set_memory_probe(pretend.figures, device_types=("cpu",), clear=pretend.clear)
    # On gloo, name gloo the accelerator so that WORLD is swapped as NCCL's WORLD is.
    rpg.register_default_process_group(accelerator_backends=(backend,) if ctx.rehearse else None)
    rpg.set_wrap_policy("all")
    group = dist.new_group(list(range(ctx.world_size)))
    one = torch.ones(1, device=device)
    dist.all_reduce(one, group=group)  # the communicator exists: a pool can be registered
    native = type(group) is dist.ProcessGroup
    data(mode=rpg.get_reload_mode(), in_place=native, world_backend=str(dist.get_backend()))
    registered, pool, hook_calls = pool_setup(ctx, torch, group, device)
    second = dist.new_group(list(range(ctx.world_size)))  # two groups: an order to keep
    made = [str(g.group_name) for g in (group, second)]
    released = release_spy(torch, dist, second, device)

    def restore_pool(groups: list[Any]) -> None:  # what a framework's own hook would do
        hook_calls.append(len(groups))
        if registered:
            group._get_backend(device).register_mem_pool(pool)

    rpg.add_reload_hook(after_reload=restore_pool, name="restore_pool")
    seen: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger = logging.getLogger("reloadpg_autopatch")
    logger.addHandler(Catch())
    logger.setLevel(logging.INFO)
    total = pretend.total if pretend is not None else torch.cuda.mem_get_info(device)[1]
    rpg.set_memory_guard(min_free_gb=2 * total / GiB)  # always "low": the guard must act
    world_before = dist.group.WORLD
    world_backend = str(dist.get_backend())

    def free_now() -> tuple[int, int]:
        if pretend is not None:
            return pretend.free, 0
        sync(device)
        return int(torch.cuda.mem_get_info(device)[0]), int(torch.cuda.memory_reserved(device))

    def fill_cache() -> tuple[int, int]:
        if pretend is None:
            cache = torch.empty(1 << 30, dtype=torch.uint8, device=device)  # 1 GiB, then cached
            del cache
        seen.clear()
        return free_now()

    cycles = []
    for number in (1, 2):
        cycle: dict[str, Any] = {"cycle": number}
        live, _ = free_now()
        rpg.destroy_process_groups()
        destroyed, _ = free_now()
        cycle.update(free_live=live, free_destroyed=destroyed)
        cycle["world_asleep"] = str(dist.get_backend())
        cycle["world_asleep_all_reduce"] = None
        if cycle["world_asleep"] == "gloo":  # the temporary WORLD (or gloo's own, in place)
            t = torch.ones(2)
            dist.all_reduce(t)
            cycle["world_asleep_all_reduce"] = t.tolist()
        cleared = pretend.cleared if pretend is not None else 0
        if native:
            before, reserved = fill_cache()
        rpg.reload_process_groups()
        if not native:
            before, reserved = fill_cache()
        x = torch.full((4,), 2.0, device=device)
        dist.all_reduce(x, group=group)
        sync(device)
        after, reserved_after = free_now()
        y = torch.ones(1, device=device)
        dist.all_reduce(y)
        sync(device)
        cycle.update(world_back=str(dist.get_backend()), world_all_reduce=y.item())
        acted = any("emptying the cache" in line for line in seen)
        if pretend is not None:
            acted = acted and pretend.cleared > cleared
            detail = f"the guard {'acted' if acted else 'did NOT act'} (clears {pretend.cleared})"
        else:
            acted = acted and after > before and reserved_after < reserved
            detail = (
                f"free {before / GiB:.2f} GiB before the guard, {after / GiB:.2f} GiB after it "
                f"(the guard {'acted' if acted else 'did NOT act'}); reserved "
                f"{reserved / GiB:.2f} -> {reserved_after / GiB:.2f} GiB"
            )
        check(f"cycle {number}: the memory guard", acted, f"{detail}; all_reduce {x.tolist()}")
        # Behind a wrapper, WORLD sleeps as a temporary gloo WORLD that works on CPU tensors;
        # in place (native), it is torch's own WORLD throughout.
        asleep_ok = (
            cycle["world_asleep_all_reduce"] == [float(ctx.world_size)] * 2
            if cycle["world_asleep"] == "gloo" or not native
            else cycle["world_asleep"] == world_backend
        )
        check(
            f"cycle {number}: WORLD {'kept in place' if native else 'swapped'} and back",
            asleep_ok
            and cycle["world_back"] == world_backend
            and y.item() == float(ctx.world_size),
            f"{world_backend} -> {cycle['world_asleep']} while asleep "
            f"(all_reduce {cycle['world_asleep_all_reduce']}) -> {cycle['world_back']}; "
            f"the same object after: {dist.group.WORLD is world_before}",
        )
        report = rpg.last_cycle_report().to_dict()
        cycle["report"] = report
        figures = report["memory"]
        present = all(figures[p] is not None for p in ("before_destroy", "after_destroy"))
        tolerance = 0 if pretend is not None else 256 * MiB
        close = present and (
            abs(figures["before_destroy"]["free"] - live) <= tolerance
            and abs(figures["after_destroy"]["free"] - destroyed) <= tolerance
        )
        check(
            f"cycle {number}: the cycle report's figures against mem_get_info",
            close,
            "report free before/after destroy "
            + (
                f"{figures['before_destroy']['free'] / MiB:.0f} / "
                f"{figures['after_destroy']['free'] / MiB:.0f} MiB"
                if present
                else "missing"
            )
            + f", measured {live / MiB:.0f} / {destroyed / MiB:.0f} MiB; report says destroy "
            f"gave back {(report['freed_bytes'] or 0) / MiB:.0f} MiB",
        )
        if pretend is None and not native:
            check(
                f"cycle {number}: destroy gave GPU memory back",
                destroyed > live,
                f"{(destroyed - live) / MiB:.0f} MiB (mem_get_info)",
            )
        check_concert(number, cycle, made, released)
        cycles.append(cycle)
        data(cycles=cycles)
    check(
        "a reload hook ran once per reload",
        len(hook_calls) == 2,
        f"groups it was given per reload: {hook_calls}",
    )
    pool_check(
        ctx,
        torch=torch,
        dist=dist,
        group=group,
        device=device,
        registered=registered,
        pool=pool,
        hook_calls=hook_calls,
        native=native,
    )
    rpg.set_memory_guard()
    first = cycles[0]
    data(
        summary={
            "mode": rpg.get_reload_mode(),
            "backend": world_backend,
            "freed_by_destroy_bytes": first["free_destroyed"] - first["free_live"],
            "report_freed_bytes": first["report"]["freed_bytes"],
            "destroy_ms": (first["report"]["destroy"] or {}).get("total_ms"),
            "reload_ms": (first["report"]["reload"] or {}).get("total_ms"),
        }
    )
    dist.destroy_process_group()


PROGRAMS = {"checks": _rank_checks}
