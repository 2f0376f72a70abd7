"""A one-rank job that reads every variable of the package many times over, for its stderr.

Run as ``python bad_variables.py HOW CYCLES`` with ``tests`` importable. ``HOW`` is ``gate``
(the gate activated the package at start-up) or ``explicit`` (it calls
``monkey_patch_torch_dist()`` itself). A one-rank gloo WORLD on its own TCPStore, one group in
the mode the environment says (which reads ``SLIME_RELOADABLE_PG_MODE``), then suspend mode
with a group on the suspendable stand-in and a gloo group (policy ``all``), ``CYCLES`` full
cycles (each suspend and resume reads ``SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT``, each reload the
memory guard's settings), and the doctor-facing getters once more. Prints one JSON line:
whether torch was patched, the mode the environment gave, and the suspends the stand-in
saw (its own call log).
"""

from __future__ import annotations

import json
import sys
import warnings


def main() -> None:
    warnings.simplefilter("ignore")
    how, cycles = sys.argv[1], int(sys.argv[2])
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    if how == "explicit":
        rpg.monkey_patch_torch_dist()
    from reloadpg_autopatch.tools import cpu_nccl as s

    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    rpg.set_wrap_policy("all")
    modes = [rpg.get_reload_mode()]
    held = [dist.new_group([0], group_desc="env-mode")]  # a group the program drops is released
    rpg.set_reload_mode("suspend")
    held.append(dist.new_group([0], backend=s.NAME_A, group_desc="standin"))
    held.append(dist.new_group([0], group_desc="gloo"))
    for _ in range(cycles):
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        rpg.get_memory_guard()
    suspends = len(s.calls("suspend", outcome="ok"))
    print(json.dumps({"patched": rpg.is_patched(), "modes": modes, "suspends": suspends}))


if __name__ == "__main__":
    main()
