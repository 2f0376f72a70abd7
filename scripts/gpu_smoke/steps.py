"""The steps in the order of their value, one module each, and the rank programs they run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import (
    native_nccl2,
    nccl_suspend,
    package_suspend,
    preflight,
    suspend_probes,
    wrapper_checks,
    wrapper_demo,
)
from .common import BUDGET_S, CHECK_S, REAP_S
from .rank import Ctx

_MODULES = (
    preflight,
    nccl_suspend,
    wrapper_demo,
    wrapper_checks,
    package_suspend,
    native_nccl2,
    suspend_probes,
)
STEPS = tuple(module.STEP for module in _MODULES)
#: Every rank program by name, as ``--rank-program`` names it.
PROGRAMS: dict[str, Callable[[Ctx], None]] = {
    name: program for module in _MODULES for name, program in module.PROGRAMS.items()
}


def worst_case_table() -> dict[str, Any]:
    """Each step's worst case in seconds (deadlines, plus a GPU check and reaping per run)."""
    rows = {s.name: s.worst_case_s for s in STEPS}
    return {
        "steps": rows,
        "total_s": sum(rows.values()),
        "budget_s": BUDGET_S,
        "per_run_overhead_s": CHECK_S + REAP_S,
        "run_deadlines_s": {s.name: [r.deadline_s for r in s.worst_runs()] for s in STEPS},
    }
