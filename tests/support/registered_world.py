"""A rank with every group wrapped and WORLD registered, and sums worked out by hand.

WORLD is registered with ``accelerator_backends=("gloo",)``, so that it is swapped on CPU as an
NCCL WORLD is on a GPU, under a 20 s timeout, so that a mismatch between ranks fails within it
instead of hanging for minutes.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from tests.support.ranks import Rank

#: WORLD's timeout: a mismatch between ranks fails within it instead of hanging for minutes.
TIMEOUT = timedelta(seconds=20)


def start(ctx: Rank, register: bool = True) -> Any:
    """Wrap every group, join WORLD (the gate already patched torch), register WORLD."""
    import warnings

    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    warnings.simplefilter("ignore", FutureWarning)
    rpg.set_wrap_policy("all")
    ctx.init(timeout=TIMEOUT.total_seconds())
    if register:
        rpg.register_default_process_group(TIMEOUT, accelerator_backends=("gloo",))
    return dist


def sums(dist: Any, groups: dict[str, Any], rank: int) -> dict[str, Any]:
    """all_reduce of rank+1 and all_gather_into_tensor of rank on each group (members only)."""
    import torch

    out = {}
    for label, group in groups.items():
        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t, group=group)
        gathered = torch.zeros(dist.get_world_size(group))
        dist.all_gather_into_tensor(gathered, torch.tensor([float(rank)]), group=group)
        out[label] = (t.item(), gathered.tolist())
    return out


def expected(members: list[int]) -> tuple[float, list[float]]:
    return float(sum(r + 1 for r in members)), [float(r) for r in members]
