"""One rank of the native-mode destroy at many groups: ``--groups`` groups of every rank, in place.

Each repetition times one destroy and one reload after a barrier and reports the destroy's wall
time, its ``sync`` phase (the agreement and this rank's deletes of what its rebuilds wrote), the
store listings the cycle made (``store.sweep``), and the reload's time.
"""

from __future__ import annotations

import sys
import time
import warnings

from reloadpg_autopatch.tools import launch


def main() -> int:
    parser = launch.rank_parser("one rank of the native-mode destroy at many groups")
    parser.add_argument("--groups", type=int, required=True)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.groups.store import sweep

    rpg.monkey_patch_torch_dist()
    rpg.set_wrap_policy("all")  # gloo groups too: they stand for NCCL's here
    launch.init_rank(args, timeout=300)
    held = [dist.new_group() for _ in range(args.groups)]
    listings = []
    listed = sweep._list

    def counted(store: object) -> object:
        listings.append(1)
        return listed(store)

    sweep._list = counted
    rpg.destroy_process_groups()  # warm-up, untimed: the world's one-off sweep is here
    rpg.reload_process_groups()
    for rep in range(args.reps):
        dist.barrier()
        before = len(listings)
        started = time.perf_counter()
        rpg.destroy_process_groups()
        destroy = (time.perf_counter() - started) * 1e3
        phases = rpg.last_cycle_report().to_dict()["destroy"]["phases"]
        started = time.perf_counter()
        rpg.reload_process_groups()
        reload = (time.perf_counter() - started) * 1e3
        rebuilt = len(rpg.last_cycle_report().to_dict()["reload"]["groups"].get("rebuilt", []))
        launch.emit(
            {
                "type": "time",
                "rep": rep,
                "destroy_ms": destroy,
                "sync_ms": phases.get("sync", 0.0),
                "reload_ms": reload,
                "listings": len(listings) - before,
                "rebuilt": rebuilt,
            }
        )
    launch.emit(
        {
            "type": "groups",
            "held": len(held),
            "reloadable": len(rpg.reloadable_groups()),
            "mode": rpg.get_reload_mode(),
        }
    )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
