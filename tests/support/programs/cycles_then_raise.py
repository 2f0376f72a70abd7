"""One rank that swaps WORLD through many destroy/reload cycles, then dies of an uncaught error.

Run as ``python cycles_then_raise.py CYCLES`` with ``SLIME_RELOADABLE_PG=1``: the gate alone
patches torch. WORLD (gloo, world size 1) is registered with ``accelerator_backends=("gloo",)``
so that every cycle swaps it for a temporary WORLD and back, as an NCCL WORLD is swapped on a
GPU. torch's ``init_process_group`` chains a new ``sys.excepthook`` each time it runs; the real
init of this program installs one (``[rank0]: `` before each line of a traceback), and nothing
else should. Prints one JSON line (how many WORLDs torch built, how long the cycles took), then
raises ``RuntimeError(MARKER)`` and lets the interpreter print it through ``sys.excepthook``.
"""

from __future__ import annotations

import json
import sys
import time
import warnings

MARKER = "uncaught after the cycles"


def main() -> None:
    warnings.simplefilter("ignore")
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch as rpg

    cycles = int(sys.argv[1])
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    rpg.register_default_process_group(accelerator_backends=("gloo",))

    worlds = []  # every default group torch builds (init_process_group's group_desc)
    helper = c10d._new_process_group_helper

    def counting(*args, **kwargs):
        if kwargs.get("group_desc") == "default_pg":
            worlds.append(1)
        return helper(*args, **kwargs)

    c10d._new_process_group_helper = counting
    started = time.monotonic()
    for _ in range(cycles):
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
    elapsed = time.monotonic() - started
    c10d._new_process_group_helper = helper
    print(
        json.dumps({"patched": rpg.is_patched(), "worlds_built": len(worlds), "seconds": elapsed}),
        flush=True,
    )
    raise RuntimeError(MARKER)


if __name__ == "__main__":
    main()
