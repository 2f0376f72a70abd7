"""One rank of the swap figure: destroying a registered WORLD, its temporary WORLD eager or lazy.

gloo plays the accelerator (``accelerator_backends=("gloo",)``), so every destroy swaps WORLD for
a temporary gloo WORLD. The eager variant creates that WORLD as torch would by default (a full
mesh: every rank connects to every other); the lazy one as the package does. Each repetition
runs both, alternating which goes first, each after a barrier; the rank reports its own times.
"""

from __future__ import annotations

import contextlib
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
    from reloadpg_autopatch.groups import backends

    reloadpg_autopatch.monkey_patch_torch_dist()
    launch.init_rank(args, timeout=120)
    import torch
    import torch.distributed as dist

    reloadpg_autopatch.register_default_process_group(accelerator_backends=("gloo",))
    lazy = backends.lazy_gloo

    def eager(enabled: bool = True) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    variants = {"eager": eager, "lazy": lazy}
    creating: list[float] = []
    init = dist.init_process_group

    def timed_init(*args: object, **kwargs: object) -> None:
        # What the variants differ in: creating the temporary WORLD. The rest of a destroy is
        # torch destroying the accelerator WORLD (gloo here), the same in both.
        started = time.perf_counter()
        init(*args, **kwargs)
        creating.append((time.perf_counter() - started) * 1e3)

    dist.init_process_group = timed_init
    for rep in range(-1, args.reps):  # rep -1: warm-up, untimed
        order = list(variants) if rep % 2 == 0 else list(reversed(variants))
        for name in order:
            backends.lazy_gloo = variants[name]  # what _init_world looks up when it swaps
            dist.barrier()
            creating.clear()
            started = time.perf_counter()
            reloadpg_autopatch.destroy_process_groups()
            elapsed = (time.perf_counter() - started) * 1e3
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
                        "create_ms": sum(creating),
                    }
                )
    backends.lazy_gloo = lazy
    dist.init_process_group = init
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
