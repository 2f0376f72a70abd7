"""One rank of a suspend-mode job whose ``suspend()`` or ``resume()`` never returns on a peer.

Run as ``python suspend_watchdog.py HOST PORT RANK WORLD_SIZE WARM HANG`` with
``SLIME_RELOADABLE_PG=1`` (the gate alone patches torch) and ``tests`` importable: it joins the
test's TCPStore, starts a gloo WORLD with WORLD's timeout from ``WATCHDOG_WORLD_TIMEOUT``
(seconds, default 60), makes one group on the suspendable stand-in (``group_desc="tp-watched"``),
runs ``WARM`` full destroy/reload cycles, then, when ``HANG`` is ``PHASE@RANKS`` (``suspend`` or
``resume``), tells the stand-in's backend on those ranks that this call never arrives (its live
``settings.hang``; ``-`` leaves the switches to the environment, e.g. ``SUSPENDABLE_HANG``;
``gil``: the suspend is stuck in C code holding the GIL), and runs one more cycle. Before each
step it writes ``MARK <step> <time.time()>`` to stderr, so the test can time what follows. A
rank that gets through the cycle prints ``RETURNED`` to stdout: with a hang it must not, the
watchdog must end it with SIGABRT.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from datetime import timedelta


def mark(step: str) -> None:
    sys.stderr.write(f"MARK {step} {time.time():.3f}\n")
    sys.stderr.flush()


def main() -> None:
    warnings.simplefilter("ignore")
    host, port, rank, world_size, warm, hang = sys.argv[1:7]
    rank, world_size, warm = int(rank), int(world_size), int(warm)
    import torch
    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.tools import cpu_nccl as s

    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    s.register()
    rpg.set_reload_mode("suspend")
    timeout = timedelta(seconds=float(os.environ.get("WATCHDOG_WORLD_TIMEOUT", "60")))
    store = dist.TCPStore(
        host, int(port), world_size, is_master=False, timeout=timedelta(seconds=60)
    )
    # Ranks start seconds apart on a loaded machine: meet first, so that a short WORLD
    # timeout bounds only what follows.
    store.add("watchdog/ready", 1)
    deadline = time.monotonic() + 60
    while store.add("watchdog/ready", 0) < world_size and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
    group = dist.new_group(list(range(world_size)), backend=s.NAME_A, group_desc="tp-watched")
    for _ in range(warm):
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
    if hang != "-":
        phase, _, ranks = hang.partition("@")
        if rank in {int(r) for r in ranks.split(",")}:
            backend = group._get_backend(torch.device("cpu"))
            if phase == "gil":
                import ctypes

                # Stuck in C code that holds the GIL: no Python thread of this process runs.
                backend.suspend = lambda: ctypes.PyDLL(None).sleep(3600)
            else:
                backend.settings.hang = phase
    mark("destroy")
    rpg.destroy_process_groups()
    mark("reload")
    rpg.reload_process_groups()
    print("RETURNED", flush=True)


if __name__ == "__main__":
    main()
