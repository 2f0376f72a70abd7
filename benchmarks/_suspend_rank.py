"""One rank of the suspend benchmark: Megatron's group set and WORLD on the suspendable stand-in.

Each repetition times one destroy + reload cycle after a barrier; the rank reports the cycle's
wall time, the time spent inside the backend's own suspend and resume calls (the stand-in's
barriers, what NCCL's own work would be on a GPU), the groups the backend created during the
cycle, and the store operations the cycle made, counted by a store that forwards to the
launcher's.
"""

from __future__ import annotations

import sys
import time
import warnings
from datetime import timedelta
from typing import Any

from reloadpg_autopatch.tools import launch


def _counting(inner: Any) -> Any:
    import torch.distributed as dist

    class Counting(dist.Store):
        def __init__(self) -> None:
            super().__init__()
            self.ops = 0

        def _count(self, value: Any) -> Any:
            self.ops += 1
            return value

        def set(self, key: str, value: Any) -> None:
            self._count(inner.set(key, value))

        def get(self, key: str) -> Any:
            return self._count(inner.get(key))

        def add(self, key: str, value: int) -> int:
            return self._count(inner.add(key, value))

        def compare_set(self, key: str, expected: Any, desired: Any) -> Any:
            return self._count(inner.compare_set(key, expected, desired))

        def wait(self, keys: Any, timeout: Any = None) -> None:
            self._count(inner.wait(keys) if timeout is None else inner.wait(keys, timeout))

        def check(self, keys: Any) -> bool:
            return self._count(inner.check(keys))

        def multi_get(self, keys: Any) -> Any:
            return self._count(inner.multi_get(keys))

        def multi_set(self, keys: Any, values: Any) -> None:
            self._count(inner.multi_set(keys, values))

        def delete_key(self, key: str) -> bool:
            return self._count(inner.delete_key(key))

        def num_keys(self) -> int:
            return inner.num_keys()

        def list_keys(self) -> Any:  # a sweep's listing counts too
            return self._count(inner.list_keys())

        def append(self, key: str, value: Any) -> None:
            self._count(inner.append(key, value))

        def has_extended_api(self) -> bool:
            return True

    return Counting()


def _time_backend_calls() -> list[float]:
    """The CPU seconds this thread spends inside the model's suspend and resume calls (its
    pretend NCCL work: the host copy of the buffers), counted into the returned cell."""
    from reloadpg_autopatch.tools.cpu_nccl import protocol

    spent = [0.0]
    original = protocol.SuspendProtocol._call

    def timed(self: Any, op: str, body: Any) -> Any:
        if op not in ("suspend", "resume"):
            return original(self, op, body)
        started = time.thread_time()
        try:
            return original(self, op, body)
        finally:
            spent[0] += time.thread_time() - started

    protocol.SuspendProtocol._call = timed
    return spent


def main() -> int:
    parser = launch.rank_parser("one rank of the suspend benchmark")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.tools import cpu_nccl as suspendable

    suspendable.register()
    in_calls = _time_backend_calls()
    rpg.monkey_patch_torch_dist()
    rpg.set_memory_guard(0)
    store = _counting(
        dist.TCPStore(
            args.host, args.port, args.world_size, is_master=False, timeout=timedelta(seconds=120)
        )
    )
    dist.init_process_group(
        suspendable.NAME_A,
        store=store,
        rank=args.rank,
        world_size=args.world_size,
        timeout=timedelta(seconds=120),
    )
    mode = rpg.get_reload_mode()
    # Behind wrappers WORLD is swapped for a gloo WORLD, as an NCCL WORLD would be.
    rpg.register_default_process_group(
        accelerator_backends=None if mode == "suspend" else (suspendable.NAME_A,)
    )
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    groups = len(rpg.reloadable_groups())

    def cycle() -> dict[str, float]:
        created = suspendable.creations()
        ops = store.ops
        in_calls[0] = 0.0
        cpu = time.thread_time()
        started = time.perf_counter()
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        wall = (time.perf_counter() - started) * 1e3
        cpu = (time.thread_time() - cpu) * 1e3
        report = rpg.last_cycle_report().to_dict()
        nccl = report["nccl"] or {}
        calls = nccl.get("suspend_ms", 0.0) + nccl.get("resume_ms", 0.0)
        phases = {
            f"{step} {name}": ms
            for step in ("destroy", "reload")
            for name, ms in ((report.get(step) or {}).get("phases") or {}).items()
        }
        return {
            "ms": wall,
            "own_cpu_ms": max(cpu - in_calls[0] * 1e3, 0.0),
            "backend_ms": calls,
            "suspend_ms": nccl.get("suspend_ms", 0.0),
            "resume_ms": nccl.get("resume_ms", 0.0),
            "phases": phases,
            "created": suspendable.creations() - created,
            "store_ops": store.ops - ops,
        }

    cycle()  # warm-up, untimed
    for rep in range(args.reps):
        dist.barrier()
        launch.emit({"type": "time", "rep": rep, **cycle()})
    launch.emit({"type": "groups", "reloadable": groups, "mode": mode})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
