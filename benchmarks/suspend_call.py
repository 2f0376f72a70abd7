"""Per-call cost of a group in suspend mode while awake, against unpatched torch, in ns.

Run in a fresh interpreter (``python -m benchmarks.suspend_call ROUNDS``) with
``SLIME_RELOADABLE_PG_MODE=suspend``, which patches itself. On torch 2.14 the group is torch's
own object and no collective is wrapped (the pre-hook that guards it exists only while it
sleeps), so the cost is nil by construction; this measures it anyway: the group after a
suspend cycle, called through ``torch.distributed``, against a twin never suspended called
through torch's original function, in the same shuffled rounds (``benchmarks.overhead``'s
method), with an identical second baseline as the noise control.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from benchmarks.overhead import _batched, _overhead, _single


def measure(rounds: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch import _originals
    from reloadpg_autopatch.patching.wrapgen import MARKER
    from reloadpg_autopatch.tools import cpu_nccl as suspendable

    suspendable.register()
    rpg.monkey_patch_torch_dist()
    rpg.set_wrap_policy("all")
    rpg.set_memory_guard(0)
    dist.init_process_group(suspendable.NAME_A, store=dist.HashStore(), rank=0, world_size=1)
    cycled = dist.new_group([0])
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    twin = dist.new_group([0])  # created after the cycle: never suspended, never hooked
    tensor = torch.ones(1)
    out: dict[str, Any] = {
        "mode": rpg.get_reload_mode(),
        "cycled_type": type(cycled).__name__,
        "collectives_wrapped": hasattr(dist.all_reduce, MARKER),
        "suspended_once": "1"
        in (rpg.last_cycle_report().to_dict()["nccl"] or {"groups": {}})["groups"],
    }
    for name in ("get_world_size", "all_reduce"):
        original, ours = _originals.original(name), getattr(dist, name)
        if name == "get_world_size":
            calls = {
                "unpatched": lambda o=original: o(group=twin),
                "control": lambda o=original: o(group=twin),
                "suspend mode, after a cycle": lambda f=ours: f(group=cycled),
            }
            samples = _batched(calls, rounds, 20000)
        else:
            calls = {
                "unpatched": lambda o=original: o(tensor, group=twin),
                "control": lambda o=original: o(tensor, group=twin),
                "suspend mode, after a cycle": lambda f=ours: f(tensor, group=cycled),
            }
            samples = _single(calls, rounds * 50)
        batched = name == "get_world_size"
        out[name] = {
            label: _overhead(samples[label], samples["unpatched"], batched)
            for label in ("control", "suspend mode, after a cycle")
        }
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 30)))
