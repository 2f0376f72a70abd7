"""Step 3, ``wrapper_demo``: the package's demo rank itself in the wrapper mode on ``nccl``.

Megatron's groups and its bound collectives on CUDA tensors (plain torch groups without
megatron-core), the free GPU memory around each destroy, the cycle report. The demo rank
speaks the package's events (``tools.launch.emit``); the script turns them into checks here.
"""

from __future__ import annotations

import argparse
from typing import Any

from .common import GATE, HOST, MODE_ENV
from .plan import Facts, Run, Step, gpu_reason
from .rank import Ctx


def _plan_wrapper_demo(facts: Facts) -> tuple[list[Run], str | None]:
    reason = gpu_reason(facts) or facts.package_reason()
    if reason is not None:
        return [], reason
    backend = "gloo" if facts.rehearse else "nccl"
    env = {GATE: "1", MODE_ENV: "wrapper"}
    return [Run(f"demo on {backend}", "demo", 1, 50.0, env, ("--backend", backend))], None


STEP = Step(
    "wrapper_demo",
    "the demo's cycle in the wrapper mode on nccl (Megatron's bound collectives on CUDA)",
    _plan_wrapper_demo,
)


def _rank_demo(ctx: Ctx) -> None:
    """The package's demo rank itself (``tools.demo_rank``), joined through rank 0's store."""
    from reloadpg_autopatch.tools import demo_rank

    args = argparse.Namespace(
        rank=ctx.rank,
        world_size=ctx.world_size,
        host=HOST,
        port=ctx.port,
        store_host=ctx.rank == 0,
        launched=True,
        cycles=ctx.cycles,
        backend=ctx.backend,
        inject_failure=None,
        timeout=max(10.0, ctx.deadline),
    )
    demo_rank.run(args)


PROGRAMS = {"demo": _rank_demo}


def demo_checks(run: Run, ranks: list[dict[str, Any]], rehearse: bool) -> list[dict[str, Any]]:
    """The demo rank speaks the package's events; turn them into checks."""
    events = ranks[0]["events"]
    ready = next((e for e in events if e.get("type") == "ready"), None)
    cycles = [e for e in events if e.get("type") == "cycle"]
    checks = []
    if ready is None:
        return [{"name": "the demo set up", "status": "failed", "detail": "no 'ready' event"}]
    checks.append(
        {
            "name": "activated by the gate alone",
            "status": "ok" if ready.get("activation") == "pth" else "failed",
            "detail": f"activation {ready.get('activation')!r} (want 'pth')",
        }
    )
    bindings = ready.get("bindings") or {}
    if ready.get("megatron"):
        patched = bindings.get("patched", 0) + bindings.get("native", 0)
        checks.append(
            {
                "name": "Megatron's bound collectives",
                "status": "ok" if patched == bindings.get("found") else "failed",
                "detail": f"megatron-core {ready['megatron']}, bindings {bindings}",
            }
        )
    else:
        checks.append(
            {
                "name": "Megatron's bound collectives",
                "status": "skipped",
                "detail": "skipped: megatron-core not installed (plain torch groups instead)",
            }
        )
    for cycle in cycles:
        live, destroyed, _reloaded = cycle.get("free_mib") or (None, None, None)
        if live is None or rehearse:
            continue
        wrapper = "wrapper" in run.env.get(MODE_ENV, "")
        checks.append(
            {
                "name": f"cycle {cycle['cycle']}: destroy gave GPU memory back",
                "status": "ok" if destroyed > live or not wrapper else "failed",
                "detail": f"free MiB live {live:.0f}, after destroy {destroyed:.0f}",
            }
        )
    want = int(_option(run, "--cycles", "2"))
    checks.append(
        {
            "name": "every cycle reported",
            "status": "ok" if len(cycles) == want else "failed",
            "detail": f"{len(cycles)} of {want} cycles",
        }
    )
    return checks


def _option(run: Run, name: str, default: str) -> str:
    options = list(run.options)
    return options[options.index(name) + 1] if name in options else default


def demo_summary(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The demo rank's cycles as the step's summary gives them (it reports no ``summary``)."""
    cycles = [e for e in events if e.get("type") == "cycle"]
    return [
        {
            "cycle": c["cycle"],
            "destroy_ms": round(c["destroy_ms"], 1),
            "reload_ms": round(c["reload_ms"], 1),
            "free_mib": c.get("free_mib"),
            "freed_bytes": (c.get("report") or {}).get("freed_bytes"),
        }
        for c in cycles
    ]
