"""Figure 3: cost of the rebind sweep after ``import megatron.core``, in a fresh interpreter.

Megatron is imported first and the patch applied late, which is the situation the sweep is
for; its first run (the one that rebinds Megatron's bindings) is timed, then repeated sweeps
over every module (``"*"``) and over the default prefix.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from typing import Any

from benchmarks.stats import summarize


def measure(repeats: int) -> dict[str, Any]:
    warnings.simplefilter("ignore")
    import megatron.core
    import megatron.core.distributed
    import megatron.core.tensor_parallel  # noqa: F401

    import reloadpg_autopatch
    from reloadpg_autopatch.patching import sweep

    reloadpg_autopatch.monkey_patch_torch_dist(rebind_prefixes=["no_such_package_for_timing"])
    started = time.perf_counter()
    first = sweep.rebind("*")
    first_ms = (time.perf_counter() - started) * 1e3
    modules = len(sys.modules)
    timings: dict[str, list[float]] = {"*": [], "megatron": []}
    for _ in range(repeats):
        for prefixes, samples in timings.items():
            started = time.perf_counter()
            changed = sweep.rebind(prefixes)
            samples.append((time.perf_counter() - started) * 1e3)
            assert changed == []
    return {
        "modules": modules,
        "first_sweep": {"ms": first_ms, "rebound": len(first)},
        "repeat_ms": {k: summarize(v).as_dict() for k, v in timings.items()},
    }


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 30)))
