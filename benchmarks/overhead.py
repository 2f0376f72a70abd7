"""Figure 2: per-call overhead of the wrappers, in ns, on a one-rank gloo WORLD.

Run in a fresh interpreter (``python -m benchmarks.overhead``), which patches itself. Every
variant is timed in the same rounds, in a shuffled order, and an overhead is the median over
rounds of (variant - unpatched) within one round, so drift between rounds cancels out. A
second, identical unpatched variant ("control") shows how large a difference noise alone makes.

- ``get_world_size`` (about 250 ns) is timed in batches of calls (``timeit``).
- ``all_reduce`` (with a hand-off to gloo's worker thread) is timed call by call. Its times
  are bimodal: about 12 us when the worker thread is awake, 30 us when it must be woken, and
  the median flips between the modes from run to run. The overhead is therefore read at the
  10th percentile (the fast mode), with the 5th and 25th as its band.
"""

from __future__ import annotations

import json
import random
import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

from benchmarks.stats import percentile, summarize

UNPATCHED = "unpatched, native group"
CONTROL = "unpatched again (control)"


def slime_style(original: Any, wrapper_class: type) -> Any:
    """The wrapper shape slime uses, minus its memory check: rebuild args and kwargs."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        args = tuple(a.group if isinstance(a, wrapper_class) else a for a in args)
        kwargs = {k: (v.group if isinstance(v, wrapper_class) else v) for k, v in kwargs.items()}
        return original(*args, **kwargs)

    return wrapper


def _batched(calls: dict[str, Callable[[], Any]], rounds: int, number: int) -> dict[str, list]:
    timers = {label: timeit.Timer(call) for label, call in calls.items()}
    for timer in timers.values():
        timer.timeit(number // 10)  # warm up
    samples: dict[str, list[float]] = {label: [] for label in timers}
    labels = list(timers)
    for _ in range(rounds):
        random.shuffle(labels)
        for label in labels:
            samples[label].append(timers[label].timeit(number) / number * 1e9)
    return samples


def _single(calls: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list]:
    clock = time.perf_counter_ns
    for call in calls.values():
        for _ in range(100):
            call()
    samples: dict[str, list[float]] = {label: [] for label in calls}
    labels = list(calls)
    for _ in range(rounds):
        random.shuffle(labels)
        for label in labels:
            call = calls[label]
            started = clock()
            call()
            samples[label].append(float(clock() - started))
    return samples


def _overhead(values: list[float], base: list[float], batched: bool) -> dict[str, Any]:
    if batched:
        paired = summarize([v - b for v, b in zip(values, base, strict=True)])
        return {
            "estimate": paired.median,
            "low": paired.p25,
            "high": paired.p75,
            "statistic": "median of paired differences [IQR]",
        }
    at = {q: percentile(values, q) - percentile(base, q) for q in (5, 10, 25)}
    return {
        "estimate": at[10],
        "low": min(at[5], at[25]),
        "high": max(at[5], at[25]),
        "statistic": "difference at the 10th percentile [5th..25th]",
    }


def measure(rounds: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch
    from reloadpg_autopatch import _originals

    reloadpg_autopatch.monkey_patch_torch_dist()
    reloadpg_autopatch.set_wrap_policy("all")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    native_world = c10d._get_default_group()
    # WORLD registered for the swap: its stand-in becomes torch's default group for good.
    reloadpg_autopatch.register_default_process_group(accelerator_backends=("gloo",))
    stand_in = c10d._get_default_group()
    tensor = torch.ones(1)
    # The memory guard: a probe that answers for CPU groups (gloo has no accelerator memory)
    # and reports plenty free, so only the check itself is timed. Three groups rebuilt by the
    # same reload: ``reloadable`` and ``twin`` never armed (the guard was off during that
    # reload; the twin shows how much two identical groups differ: gloo runs a worker thread
    # per group),
    # ``settled`` armed afterwards and settled by its first call (the guard ran once and
    # left). slime's every-call behaviour arms every group, so it is timed in a pass of its
    # own, beside unpatched torch, and the groups settle again after it.
    reloadpg_autopatch.set_memory_probe(
        lambda device: reloadpg_autopatch.MemoryFigures(1 << 40, 1 << 40, 0, 0),
        device_types=("cpu",),
    )
    reloadable, twin, settled = (dist.new_group([0]) for _ in range(3))
    reloadpg_autopatch.set_memory_guard(0)
    reloadpg_autopatch.destroy_process_groups()
    reloadpg_autopatch.reload_process_groups()
    reloadpg_autopatch.set_memory_guard()
    settled.arm(torch.device("cpu"))
    dist.get_world_size(group=settled)  # the guard runs here, once
    native = reloadable.group
    world = c10d._world
    out: dict[str, Any] = {}
    for name in ("get_world_size", "all_reduce"):
        original, ours = _originals.original(name), getattr(dist, name)
        slime = slime_style(original, reloadpg_autopatch.ReloadableProcessGroup)
        args = () if name == "get_world_size" else (tensor,)
        variants = {
            UNPATCHED: (original, native),
            CONTROL: (original, native),
            "ours, native group": (ours, native),
            "ours, reloadable group": (ours, reloadable),
            "ours, reloadable group, guard settled after a reload": (ours, settled),
            "ours, reloadable group, its twin (control)": (ours, twin),
            "slime-style, native group": (slime, native),
            "slime-style, reloadable group": (slime, reloadable),
        }
        calls = {
            label: (lambda fn=fn, group=group, args=args: fn(*args, group=group))
            for label, (fn, group) in variants.items()
        }
        # No group: torch takes the default group. Both variants set it first (same cost):
        # the native WORLD, or WORLD's stand-in, which lasts across swaps.
        for label, fn, default in (
            ("unpatched, no group, native WORLD", original, native_world),
            ("ours, no group, WORLD's stand-in", ours, stand_in),
        ):
            calls[label] = lambda fn=fn, default=default, args=args: (
                setattr(world, "_default_pg", default),
                fn(*args),
            )
        if name == "get_world_size":
            samples, method = _batched(calls, rounds, number=20000), "batches of 20000 calls"
        else:
            samples, method = _single(calls, rounds * 100), "single calls"
        out[name] = {
            label: {
                "per_call_ns": summarize(values).as_dict(),
                "overhead_ns": _overhead(
                    values,
                    samples[
                        "unpatched, no group, native WORLD" if "no group" in label else UNPATCHED
                    ],
                    name == "get_world_size",
                ),
            }
            for label, values in samples.items()
        }
        out[name]["method"] = method
        every = "ours, reloadable group, guard on every call"
        pair = {
            UNPATCHED: calls[UNPATCHED],
            every: lambda fn=ours, args=args: fn(*args, group=settled),
        }
        reloadpg_autopatch.set_memory_guard(every_call=True)  # arms every live group
        extra = (
            _batched(pair, rounds, 20000)
            if name == "get_world_size"
            else _single(pair, rounds * 100)
        )
        reloadpg_autopatch.set_memory_guard()
        for group in (reloadable, twin, settled, None):  # each settles at its next call
            world._default_pg = stand_in
            dist.get_world_size(group=group)
        out[name][every] = {
            "per_call_ns": summarize(extra[every]).as_dict(),
            "overhead_ns": _overhead(extra[every], extra[UNPATCHED], name == "get_world_size"),
        }
        # Side by side: the settled group against one the guard never touched.
        out[name]["twin_vs_never_armed_ns"] = _overhead(
            samples["ours, reloadable group, its twin (control)"],
            samples["ours, reloadable group"],
            name == "get_world_size",
        )
        out[name]["guard_settled_vs_never_armed_ns"] = _overhead(
            samples["ours, reloadable group, guard settled after a reload"],
            samples["ours, reloadable group"],
            name == "get_world_size",
        )
    world._default_pg = stand_in
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 40)))
