"""What the aliasing maps behind torch's ``_world`` cost: per lookup, per new group, per reload.

Run in a fresh interpreter (``python -m benchmarks.aliases``) on a one-rank gloo WORLD. A lookup
by a native group is timed on the aliasing map and on a plain dict with the same entries, side
by side in the same rounds; a lookup by a reloadable group is what torch's unpatched functions
and DeviceMesh do. The entries a creation or a reload adds are counted, not timed: the maps
store nothing for a wrapper.
"""

from __future__ import annotations

import json
import random
import sys
import timeit
from typing import Any

from benchmarks.stats import summarize


def _paired(samples: dict[str, list[float]], ours: str, plain: str) -> dict[str, float]:
    """The summary of per-round differences: rounds drift, differences within one do not."""
    pairs = zip(samples[ours], samples[plain], strict=True)
    return summarize([a - p for a, p in pairs]).as_dict()


def measure(rounds: int) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch

    reloadpg_autopatch.monkey_patch_torch_dist()
    reloadpg_autopatch.set_wrap_policy("all")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    sizes = [len(c10d._world.pg_map)]
    group = dist.new_group([0])
    sizes.append(len(c10d._world.pg_map))
    reloadpg_autopatch.destroy_process_groups()
    reloadpg_autopatch.reload_process_groups()
    sizes.append(len(c10d._world.pg_map))
    native = group.group
    aliasing = c10d._world.pg_group_ranks
    plain = dict(aliasing)
    cases = {
        "native in plain dict": lambda: native in plain,
        "native in aliasing map": lambda: native in aliasing,
        "reloadable in aliasing map": lambda: group in aliasing,
        "plain dict [native]": lambda: plain[native],
        "aliasing map [native]": lambda: aliasing[native],
        "aliasing map [reloadable]": lambda: aliasing[group],
    }
    timers = {label: timeit.Timer(call) for label, call in cases.items()}
    samples: dict[str, list[float]] = {label: [] for label in timers}
    labels = list(timers)
    number = 50000
    for _ in range(rounds):
        random.shuffle(labels)
        for label in labels:
            samples[label].append(timers[label].timeit(number) / number * 1e9)
    dist.destroy_process_group()
    return {
        "pg_map_sizes": {"world": sizes[0], "after new_group": sizes[1], "after cycle": sizes[2]},
        "ns": {label: summarize(values).as_dict() for label, values in samples.items()},
        "paired_ns": {
            "in, native key": _paired(samples, "native in aliasing map", "native in plain dict"),
            "[], native key": _paired(samples, "aliasing map [native]", "plain dict [native]"),
        },
    }


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 30)))
