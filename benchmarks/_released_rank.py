"""One rank of the run-length row: a cycle after 100 released groups against the first cycle.

The program holds 20 groups. It times destroy+reload (the slowest rank decides, so each rep
starts after a barrier), then creates 100 more groups, uses and releases them all, as a
training step's temporary groups would be, and times the same cycle again. torch's own group
creations are counted with a spy on ``_new_process_group_helper``: the reload after the
releases must create what the first one did, no more.
"""

from __future__ import annotations

import sys
import time
import warnings

from reloadpg_autopatch.tools import launch


def main() -> int:
    parser = launch.rank_parser("one rank of the released-groups benchmark")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--released", type=int, default=100)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import reloadpg_autopatch

    reloadpg_autopatch.monkey_patch_torch_dist()
    reloadpg_autopatch.set_wrap_policy("all")
    launch.init_rank(args, timeout=120)
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    created = []
    helper = c10d._new_process_group_helper

    def spy(*a, **k):  # torch's own helper, counted: what a reload really creates
        result = helper(*a, **k)
        created.append(type(result[0]) is dist.ProcessGroup)
        return result

    c10d._new_process_group_helper = spy
    size = args.world_size
    held = [dist.new_group([i % size, (i + 1) % size]) for i in range(20)]

    def cycle(label: str, rep: int) -> None:
        dist.barrier()
        created.clear()
        started = time.perf_counter()
        reloadpg_autopatch.destroy_process_groups()
        reloadpg_autopatch.reload_process_groups()
        elapsed = (time.perf_counter() - started) * 1e3
        launch.emit(
            {"type": "time", "variant": label, "rep": rep, "ms": elapsed, "created": sum(created)}
        )

    cycle("warm-up", 0)
    for rep in range(args.reps):
        cycle("first", rep)
    import torch

    for _ in range(args.released):  # create, use, release: a training step's temporary group
        group = dist.new_group([0, 1])
        if args.rank in (0, 1):
            dist.all_reduce(torch.ones(1), group=group)
        dist.destroy_process_group(group)
    for rep in range(args.reps):
        cycle("after release", rep)
    launch.emit({"type": "groups", "held": len(held)})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
