"""``wrapper_checks`` in concert with the rest of the job: Megatron's release (a spy in place of
``fused_a2a.nccl_ep_finalize``) runs before any free, and the groups are freed in creation
order, as the cycle report says."""

from __future__ import annotations

import importlib.util
from typing import Any

from .common import error_line
from .rank import check, sync


def release_spy(torch: Any, dist: Any, group: Any, device: Any) -> list[Any] | None:
    """Megatron's ``fused_a2a.nccl_ep_finalize`` replaced by a spy that runs a collective on
    ``group`` (so it ran while that group's communicator lived) and records it; None where
    megatron-core is not installed."""
    if importlib.util.find_spec("megatron") is None:
        return None
    try:
        from megatron.core.transformer.moe import fused_a2a
    except Exception:  # megatron-core that will not import here: nothing to release
        return None
    calls: list[Any] = []

    def nccl_ep_finalize() -> None:
        x = torch.ones(1, device=device)
        try:
            dist.all_reduce(x, group=group)
            sync(device)
            calls.append(x.item())
        except Exception as error:
            calls.append(error_line(error))

    fused_a2a.nccl_ep_finalize = nccl_ep_finalize
    return calls


def check_concert(number: int, cycle: dict[str, Any], made: list[str], released: Any) -> None:
    """What the destroy freed, in which order, and what it released first (its report)."""
    destroy = cycle["report"]["destroy"] or {}
    order = destroy.get("groups", {}).get("destroyed", [])
    cycle["free_order"], cycle["releases"] = order, destroy.get("releases", [])
    ours = [name for name in order if name in made]
    check(
        f"cycle {number}: groups freed in creation order",
        ours == made,
        f"freed {order}; created {made}",
    )
    if released is None:
        check(f"cycle {number}: Megatron's release ran first", None, "megatron not installed")
        return
    check(
        f"cycle {number}: Megatron's release ran first",
        len(released) == number and isinstance(released[-1], float),
        f"spy calls {released} (each the group's all_reduce, before its free); report "
        f"{[(r['name'], r['ms']) for r in cycle['releases']]}",
    )
