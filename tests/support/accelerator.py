"""The CPU model of NCCL's suspend registered for an accelerator device type only, as NCCL is
for cuda, and ranks that join WORLD with it.

Suspend refuses what only an accelerator group can be refused for (``NCCL_CUMEM_ENABLE=0``, an
old NCCL): ``create`` makes a backend of the stand-in that answers ``name()`` with its registered
name (``ACCEL``, on ``privateuseone``), as NCCL's answers ``nccl``; a ``MIXED`` group runs its
CPU collectives on gloo. ``start`` joins WORLD in a mode with both registered, the stand-in's
pretend device answering the memory queries; ``run_once`` runs a rank function once per
session; ``backend_ops`` is what reached a group's stand-in backend.
"""

from __future__ import annotations

from typing import Any

from reloadpg_autopatch.tools import cpu_nccl as suspendable
from tests.support.ranks import GATE, Rank, run_ranks_once

#: The stand-in registered for an accelerator device type only, as NCCL is for cuda.
ACCEL = "suspendable_acc"


class _AcceleratorStandIn(suspendable.SuspendableGloo):
    """The stand-in as an accelerator-only backend, named by its registered name as NCCL's
    backend answers ``nccl`` (a gloo subclass would answer ``gloo``, a CPU backend's name)."""

    def name(self) -> str:
        return ACCEL


def create(store: Any, rank: int, size: int, timeout: Any) -> Any:
    return suspendable.track(_AcceleratorStandIn(store, rank, size, timeout))


#: A mixed group: its CPU collectives run on gloo, its accelerator leg is the stand-in.
MIXED = f"cpu:gloo,{suspendable.ACCELERATOR}:{ACCEL}"


ON_214 = suspendable.python_backend_available()


def run_once(fn: Any, n: int = 2, timeout: float = 120.0, **env: str) -> list[Any]:
    """``run_ranks(fn, n)`` with the gate on, once per session."""
    full = {**GATE, "SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT": "20", **env}
    return run_ranks_once(fn, n, timeout=timeout, env=full)


def start(ctx: Rank, mode: str, *, policy: str | None = None, world: str = "gloo") -> Any:
    """Join WORLD in ``mode``; the stand-in (also for the accelerator only) registered and its
    pretend device answering the package's memory queries. Returns (torch, dist, rpg, s)."""
    import warnings

    import torch
    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.tools import cpu_nccl as s

    warnings.simplefilter("ignore", FutureWarning)
    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    s.register()
    dist.Backend.register_backend(ACCEL, create, devices=[s.ACCELERATOR])
    rpg.set_reload_mode(mode)
    if policy is not None:
        rpg.set_wrap_policy(policy)
    rpg.set_memory_probe(s.memory_probe, device_types=("cpu", s.ACCELERATOR))
    rpg.set_memory_guard(0.0)
    ctx.init(backend=world, timeout=30.0)
    return torch, dist, rpg, s


def outcome(call: Any) -> tuple[Any, Any]:
    """``("ok", result)``, or the exception's class (compared with ``is``) and its text."""
    try:
        return ("ok", call())
    except Exception as error:
        return (type(error), str(error))


def rank_sum(dist: Any, torch: Any, rank: int, group: Any = None) -> float:
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=group)
    return t.item()


def backend_ops(s: Any, group: Any, *ops: str) -> list[tuple[str, str]]:
    """What reached ``group``'s stand-in backend (its lifecycle calls), in order."""
    import torch

    label = group._get_backend(torch.device("cpu")).label
    return [(c.op, c.outcome) for c in s.CALLS if c.backend == label and c.op in ops]
