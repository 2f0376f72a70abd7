"""Ranks in suspend mode on the CPU model of NCCL's suspend, for the suspend tests.

``run_once`` runs a rank function with the gate on, once per session for the same arguments,
so that several tests read one run and a promise has a test of its own without one more set of
ranks. ``start`` joins WORLD in a mode with the stand-in of ``reloadpg_autopatch/tools/cpu_nccl``
registered and its pretend device answering the package's memory queries; ``calls`` and
``backend`` read what reached the stand-in, ``outcome`` and ``rank_sum`` what a call gave. The
watchdog's timeout is short (``WATCHDOG_S``), so that a rank stuck in a suspend barrier ends in
seconds instead of 30 minutes. Variant B of the stand-in exists on torch 2.14 only (``needs_b``,
``VARIANTS``).
"""

from __future__ import annotations

from typing import Any

import pytest

from reloadpg_autopatch.tools import cpu_nccl as suspendable
from tests.support.ranks import GATE, Rank, run_ranks_once

#: The watchdog's timeout in the ranks: a rank left alone in a suspend barrier ends this soon.
WATCHDOG_S = "15"
#: A run's deadline.
DEADLINE = 150.0

B_AVAILABLE = suspendable.python_backend_available()
ON_214 = B_AVAILABLE  # torch 2.14: pre-hooks and Python backends; 2.13: neither
needs_b = pytest.mark.skipif(not B_AVAILABLE, reason=suspendable.PYTHON_BACKEND_REASON)
VARIANTS = [
    pytest.param(suspendable.NAME_A, id="A"),
    pytest.param(suspendable.NAME_B, id="B", marks=needs_b),
]


def run_once(fn: Any, n: int = 2, *, timeout: float = DEADLINE, **env: str) -> list[Any]:
    """``run_ranks(fn, n)`` with the gate on, once per session for the same arguments."""
    full = {**GATE, "SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT": WATCHDOG_S, **env}
    return run_ranks_once(fn, n, timeout=timeout, env=full)


def start(
    ctx: Rank,
    *,
    mode: str = "suspend",
    world: str = "gloo",
    register: bool = False,
    policy: str | None = None,
    margin_gb: float = 0.0,
    timeout: float = 30.0,
) -> tuple[Any, Any, Any, Any]:
    """Join WORLD on ``world`` in ``mode``; return (torch, torch.distributed, the package,
    the stand-in module). The pretend device answers the package's memory queries."""
    import warnings

    import torch
    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.tools import cpu_nccl as s

    warnings.simplefilter("ignore", FutureWarning)
    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    s.register()
    rpg.set_reload_mode(mode)
    if policy is not None:
        rpg.set_wrap_policy(policy)
    rpg.set_memory_probe(s.memory_probe, device_types=("cpu", s.ACCELERATOR))
    rpg.set_memory_guard(margin_gb)
    ctx.init(backend=world, timeout=timeout)
    if register:
        rpg.register_default_process_group()
    return torch, dist, rpg, s


def leg() -> str:
    """The stand-in whose collectives reach Python where it exists (2.14), else variant A."""
    from reloadpg_autopatch.tools import cpu_nccl as s

    return s.NAME_B if s.python_backend_available() else s.NAME_A


def outcome(call: Any) -> tuple[str, Any]:
    """``("ok", result)`` or ``(exception class name, message)``."""
    try:
        return ("ok", call())
    except Exception as error:
        return (type(error).__name__, str(error))


def backend(group: Any) -> Any:
    import torch

    return group._get_backend(torch.device("cpu"))


def rank_sum(dist: Any, torch: Any, rank: int, group: Any = None) -> float:
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=group)
    return t.item()


def calls(s: Any, since: int = 0, *, stats: bool = False) -> list[tuple[str, str, str, str]]:
    """The stand-in's call log from ``since``: (backend, op, state, outcome)."""
    return [
        (c.backend, c.op, c.state, c.outcome)
        for c in s.CALLS[since:]
        if stats or c.op != "memory_stats"
    ]


def is_suspended_error(kind: str, text: str, *names: str) -> bool:
    return (
        kind == "GroupSuspendedError"
        and "reload_process_groups()" in text
        and all(n in text for n in names)
    )
