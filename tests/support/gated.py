"""Ranks whose control is the same rank with the gate off (the fidelity tests).

``GATES`` runs a test with ``SLIME_RELOADABLE_PG`` unset and set; ``start`` joins WORLD and
checks that the gate alone decided whether ``torch.distributed`` is patched; ``stages`` yields
before any cycle and after each destroy/reload (gate off: plain repeats); ``reloadable`` checks,
gate on, that the groups under test are the package's, or the test proves nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.ranks import Rank

GATE = "SLIME_RELOADABLE_PG"
ON: dict[str, str | None] = {GATE: "1"}
OFF: dict[str, str | None] = {GATE: None}
GATES = pytest.mark.parametrize("env", [OFF, ON], ids=["gate-off", "gate-on"])
CYCLES = 2
RANK_TIMEOUT = 240.0


def start(ctx: Rank, timeout: float = 30.0) -> tuple[Any, bool]:
    """Join WORLD; check that the gate alone decided whether torch.distributed is patched."""
    import os
    import warnings

    warnings.simplefilter("ignore", FutureWarning)  # _all_gather_base and friends
    warnings.simplefilter("ignore", UserWarning)  # Megatron without Apex
    ctx.init(timeout=timeout)
    import torch.distributed as dist

    active = os.environ.get(GATE) == "1"
    patched = hasattr(dist.all_reduce, "__reloadpg_autopatch__")
    if patched != active:
        raise AssertionError(f"gate {'on' if active else 'off'}, but patched={patched}")
    return dist, active


def stages(active: bool):
    """Yield a label before any cycle and after each destroy/reload (gate off: plain repeats)."""
    yield "before any cycle"
    for cycle in range(1, CYCLES + 1):
        if active:
            import reloadpg_autopatch as rpg

            rpg.destroy_process_groups()
            rpg.reload_process_groups()
        yield f"after cycle {cycle}"


def reloadable(active: bool, *groups: Any) -> None:
    """Gate on, the groups under test must really be ours, or the test proves nothing."""
    if active:
        import reloadpg_autopatch as rpg

        for group in groups:
            assert isinstance(group, rpg.ReloadableProcessGroup), group


def native_type() -> type:
    import torch

    return torch._C._distributed_c10d.ProcessGroup


def pair_groups(dist: Any, active: bool) -> dict[str, Any]:
    """WORLD, a native pair and (gate on) a reloadable pair, made in one order on every rank."""
    groups: dict[str, Any] = {"world": None}
    if active:
        import reloadpg_autopatch as rpg

        rpg.set_wrap_policy("none")
    groups["native"] = dist.new_group([0, 1])
    assert type(groups["native"]) is native_type(), groups["native"]
    if active:
        rpg.set_wrap_policy("all")
        groups["reloadable"] = dist.new_group([0, 1])
        reloadable(active, groups["reloadable"])
    return groups


def pair_and_single(dist: Any, active: bool, rank: int) -> dict[str, tuple[Any, list[int]]]:
    """A two-rank group and a one-rank group, reloadable with the gate on, with their members."""
    if active:
        import reloadpg_autopatch as rpg

        rpg.set_wrap_policy("all")
    pair = dist.new_group([0, 1])
    single = [dist.new_group([0]), dist.new_group([1])][rank]
    reloadable(active, pair, single)
    return {"pair": (pair, [0, 1]), "single": (single, [rank])}


def unwrap(group: Any) -> Any:
    """The native group inside ours (public API), to read torch's own state for it."""
    import reloadpg_autopatch as rpg

    return rpg.unwrap(group)


def world_in_cycle(active: bool) -> None:
    """Gate on: gloo plays the accelerator, so WORLD itself is swapped out and back."""
    if active:
        import reloadpg_autopatch as rpg

        rpg.register_default_process_group(accelerator_backends=("gloo",))


def resolve_ranks(resolve: Any, *args: Any) -> tuple[Any, Any]:
    """(group, its ranks per torch) or (None, the error) for a lookup that may fail."""
    from torch.distributed import distributed_c10d as c10d

    try:
        group = resolve(*args)
        return group, c10d.get_process_group_ranks(group)
    except Exception as error:
        return None, f"{type(error).__name__}: {error}"
