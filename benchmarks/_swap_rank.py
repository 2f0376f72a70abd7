"""One rank of the swap figure: destroying a registered WORLD, its temporary WORLD eager or lazy.

gloo plays the accelerator (``accelerator_backends=("gloo",)``), so every destroy swaps WORLD for
a temporary gloo WORLD. The eager variant creates that WORLD as torch would by default (a full
mesh: every rank connects to every other); the lazy one as the package does. Each repetition
runs both, alternating which goes first, each after a barrier; the rank reports its own times:
the wall time and this process's CPU time of creating the temporary WORLD, the sockets it
opened, and the whole destroy.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings

from reloadpg_autopatch.tools import launch


def main() -> int:
    parser = launch.rank_parser("one rank of the temporary-WORLD swap benchmark")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import reloadpg_autopatch
    from reloadpg_autopatch.groups.world import swap as world

    reloadpg_autopatch.monkey_patch_torch_dist()
    launch.init_rank(args, timeout=120)
    import torch
    import torch.distributed as dist

    reloadpg_autopatch.register_default_process_group(accelerator_backends=("gloo",))
    lazy = world.lazy_gloo  # the name ``world._init_world`` calls (bound from ``backends``)

    def eager(enabled: bool = True) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    variants = {"eager": eager, "lazy": lazy}
    #: Each WORLD creation of a cycle: wall ms, this process's CPU ms, sockets it opened.
    creating: list[tuple[float, float, int]] = []
    init = dist.init_process_group

    def sockets() -> int:
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        return count

    def timed_init(*args: object, **kwargs: object) -> None:
        # What the variants differ in: creating the temporary WORLD. The rest of a destroy is
        # torch destroying the accelerator WORLD (gloo here), the same in both.
        before = sockets()
        started, cpu = time.perf_counter(), time.process_time()
        init(*args, **kwargs)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        creating.append((wall * 1e3, cpu * 1e3, sockets() - before))

    dist.init_process_group = timed_init
    for rep in range(-1, args.reps):  # rep -1: warm-up, untimed
        order = list(variants) if rep % 2 == 0 else list(reversed(variants))
        for name in order:
            world.lazy_gloo = variants[name]  # what _init_world looks up when it swaps
            dist.barrier()
            creating.clear()
            started = time.perf_counter()
            reloadpg_autopatch.destroy_process_groups()
            elapsed = (time.perf_counter() - started) * 1e3
            # The destroy's creation only: the reload below restores the gloo WORLD (a full
            # mesh in both variants), which is not the temporary WORLD's cost.
            (create_ms, create_cpu_ms, create_sockets), *_ = creating
            # The temporary WORLD works, lazy or not: a CPU collective between the two.
            t = torch.ones(1)
            dist.all_reduce(t)
            assert t.item() == args.world_size, t
            reloadpg_autopatch.reload_process_groups()
            if rep >= 0:
                launch.emit(
                    {
                        "type": "time",
                        "rep": rep,
                        "variant": name,
                        "ms": elapsed,
                        "create_ms": create_ms,
                        "create_cpu_ms": create_cpu_ms,
                        "create_sockets": create_sockets,
                    }
                )
    world.lazy_gloo = lazy
    dist.init_process_group = init
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
