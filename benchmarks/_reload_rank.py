"""One rank of figure 4: our destroy+reload against torch destroying and re-creating.

Both variants hold the same groups, created with the same arguments in the same order (the
baseline's creation calls are recorded as they happen). Each repetition runs both variants,
alternating which goes first, each after a barrier; the rank reports its own times.
"""

from __future__ import annotations

import sys
import time
import warnings
from typing import Any

from reloadpg_autopatch.tools import launch


def _build(scenario: str, world_size: int) -> list[Any]:
    """Create the scenario's groups; the caller keeps them (dropped groups are not reloaded)."""
    import torch.distributed as dist

    if scenario == "megatron":
        from megatron.core import parallel_state

        parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
        return []  # Megatron's globals hold its groups
    return [
        dist.new_group([index % world_size, (index + 1) % world_size])
        for index in range(int(scenario))
    ]


def _record_baseline(scenario: str, world_size: int) -> list[list[Any]]:
    """Create the groups natively, remembering every creation call."""
    import torch.distributed as dist

    import reloadpg_autopatch

    reloadpg_autopatch.set_wrap_policy("none")
    calls: list[list[Any]] = []
    ours = dist.new_group

    def recording(*args: Any, **kwargs: Any) -> Any:
        group = ours(*args, **kwargs)
        calls.append([args, kwargs, group])
        return group

    dist.new_group = recording
    try:
        _build(scenario, world_size)
    finally:
        dist.new_group = ours
    if scenario == "megatron":
        from megatron.core import parallel_state

        # Forget Megatron's globals so it can build its set again. This also destroys its two
        # gloo data-parallel groups: the untimed warm-up cycle rebuilds them.
        parallel_state.destroy_model_parallel()
    return calls


def main() -> int:
    parser = launch.rank_parser("one rank of benchmark figure 4")
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import reloadpg_autopatch
    from reloadpg_autopatch import _originals

    reloadpg_autopatch.monkey_patch_torch_dist()
    launch.init_rank(args, timeout=120)
    import torch.distributed as dist

    baseline = _record_baseline(args.scenario, args.world_size)
    reloadpg_autopatch.set_wrap_policy("all")
    held = _build(args.scenario, args.world_size)
    groups = len(reloadpg_autopatch.reloadable_groups())
    create, destroy = _originals.original("new_group"), _originals.original("destroy_process_group")
    from torch.distributed.distributed_c10d import _world

    def torch_cycle() -> None:
        # Destroy and let go at once, as ours does: the memory is what the cycle is for.
        for call in reversed(baseline):
            if call[2] in _world.pg_map:
                destroy(call[2])
            call[2] = None
        for call in baseline:
            call[2] = create(*call[0], **call[1])

    def our_cycle() -> None:
        reloadpg_autopatch.destroy_process_groups()
        reloadpg_autopatch.reload_process_groups()

    variants = {"torch": torch_cycle, "ours": our_cycle}
    for cycle in variants.values():  # warm-up, untimed
        cycle()
    for rep in range(args.reps):
        order = list(variants) if rep % 2 == 0 else list(reversed(variants))
        for name in order:
            dist.barrier()
            started = time.perf_counter()
            variants[name]()
            elapsed = (time.perf_counter() - started) * 1e3
            launch.emit({"type": "time", "rep": rep, "variant": name, "ms": elapsed})
    launch.emit(
        {
            "type": "groups",
            "reloadable": groups,
            "calls": len(baseline),
            "held": len(held),
            "collectives_patched": hasattr(dist.all_reduce, "__reloadpg_autopatch__"),
            "patched": reloadpg_autopatch.patched_names(),
        }
    )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
