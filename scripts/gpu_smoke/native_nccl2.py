"""Step 6, ``native_nccl2``: in place (native mode, torch 2.14+) on ``nccl`` and ``nccl-legacy``.

nccl2 is rebuilt in place; the classic backend cannot reconfigure, and the check is that native
mode refuses it by name, up front. Its runs are ``wrapper_checks``' program in native mode; what
differs for them (the backend a rehearsal starts WORLD on, the refusal) is here.
"""

from __future__ import annotations

import contextlib
from typing import Any

from .common import GATE, MODE_ENV, error_line
from .plan import Facts, Run, Step, gpu_reason, passes
from .rank import Ctx, check, data, load_stand_in


def _plan_native(facts: Facts) -> tuple[list[Run], str | None]:
    reason = gpu_reason(facts) or facts.package_reason()
    if reason is None and not facts.reconfigure:
        reason = f"torch {facts.torch} has no ProcessGroup.reconfigure (torch 2.14 and later)"
    if reason is None and not facts.rehearse and not facts.nccl2:
        reason = f"torch {facts.torch} has no nccl2 backend (its entry point registered none)"
    if reason is not None:
        return [], reason
    env = {GATE: "1", MODE_ENV: "native"}
    # The classic backend cannot reconfigure: its pass checks the refusal, which is quick.
    return passes(facts, "in place: checks", "checks", 1, env=env, deadlines=(27.0, 18.0)), None


STEP = Step(
    "native_nccl2",
    "in place (native mode) on nccl and nccl-legacy: nccl2 rebuilt, the classic one refused",
    _plan_native,
)


def checks_backend(ctx: Ctx) -> str:
    """The backend a checks run starts WORLD on: the one asked for; in the rehearsal gloo for
    ``nccl``, and for ``nccl-legacy`` the stand-in that cannot reconfigure (variant B, torch
    2.14: the classic backend's answer), so that the refusal is rehearsed too."""
    if not ctx.rehearse:
        return str(ctx.backend)
    if ctx.backend == "nccl-legacy":
        stand_in = load_stand_in()
        if stand_in.python_backend_available():
            return stand_in.NAME_B
    return "gloo"


def reconfigurable(world: Any) -> bool:
    """Whether WORLD's implementation says it can be rebuilt in place (False if it cannot say)."""
    try:
        return bool(getattr(world, "supports_reconfigure", False))
    except Exception:
        return False


def refused_in_place(ctx: Ctx, rpg: Any, dist: Any, found: dict[str, Any]) -> None:
    """Native mode on an implementation that cannot reconfigure: refused by name, up front."""
    try:
        rpg.register_default_process_group()
        dist.new_group(list(range(ctx.world_size)))
        refused = "no error"
    except Exception as error:
        refused = error_line(error)
    data(in_place_refused=refused)
    check(
        f"in place refused for {found.get('implementation')} (it cannot reconfigure)",
        refused.startswith("ModeRefusedError") and "reconfigure" in refused,
        refused,
    )
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


PROGRAMS: dict[str, Any] = {}  # its runs are wrapper_checks' program, in native mode
