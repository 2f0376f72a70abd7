"""What a real run does to its ranks, for the tests and ``benchmarks/whole_run.py``.

A training rank (no daemon) joins WORLD; it forks data-loader and pool workers (``forks``); a
rank is armed to die at a step of the next reload (``die_at``); threads act as ranks, as
torch's ``MultiThreadedTestCase`` runs them (``threaded_world``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from tests.support.ranks import Rank

TIMEOUT = timedelta(seconds=30)


def reconfigures() -> bool:
    import torch.distributed as dist

    return hasattr(dist.ProcessGroup, "reconfigure")


def begin(ctx: Rank, registered: bool, timeout: timedelta = TIMEOUT) -> Any:
    """Join WORLD in a process the gate patched; every group reloadable; maybe WORLD too."""
    import multiprocessing

    import reloadpg_autopatch as rpg

    # The harness starts ranks as daemons, which multiprocessing forbids to have children; a
    # training rank is no daemon.
    multiprocessing.current_process().daemon = False
    swap = None if rpg.get_reload_mode() == "native" else ("gloo",)
    return ctx.begin(world=registered, swap=swap, timeout=timeout.total_seconds())


def _square(x: int) -> int:
    return x * x


def forks(label: str) -> dict:
    """A fork-start DataLoader with workers, a fork pool, and a bare fork that exits at once."""
    import multiprocessing
    import os

    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(
        torch.arange(8.0), batch_size=2, num_workers=2, multiprocessing_context="fork", timeout=30
    )
    out: dict[str, Any] = {"label": label}
    try:
        out["loader"] = sum(float(batch.sum()) for batch in loader)
    except Exception as error:  # "DataLoader worker ... is killed by signal"
        out["loader"] = f"{type(error).__name__}: {error}"
    try:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            out["pool"] = pool.map_async(_square, range(6)).get(timeout=30)
    except Exception as error:
        out["pool"] = f"{type(error).__name__}: {error}"
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    out["bare"] = status  # 0 for a clean exit; a signal number shows up here
    return out


def in_rank_threads(rank: Callable[[int, Any], Any], join_s: float) -> dict:
    """``rank(r, store)`` for four ranks as threads of this process, as torch's
    MultiThreadedTestCase runs them: ``{"results": {r: what it returned, or its error},
    "hung": the ranks still running after join_s}``."""
    import threading

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed import multi_threaded_pg

    # As torch's MultiThreadedTestCase sets them up: names per thread, a world per thread.
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    multi_threaded_pg._install_threaded_pg()
    store = dist.HashStore()
    results: dict[int, Any] = {}

    def run(r: int) -> None:
        try:
            results[r] = rank(r, store)
        except Exception as error:
            results[r] = f"{type(error).__name__}: {error}"

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(join_s)
    hung = [r for r, thread in enumerate(threads) if thread.is_alive()]
    if not hung:
        multi_threaded_pg._uninstall_threaded_pg()
    return {"results": results, "hung": hung}


def threaded_world(ctx: Rank, policy: str | None) -> dict:
    """Four ranks as threads of this process, as torch's MultiThreadedTestCase runs them."""
    import torch
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    if policy is not None:
        rpg.set_wrap_policy(policy)

    def rank(r: int, store: Any) -> list[float]:
        dist.init_process_group("threaded", rank=r, world_size=4, store=store)
        whole = dist.new_group([0, 1, 2, 3])
        pair = dist.new_group([0, 1])
        t = torch.tensor([r + 1.0])
        dist.all_reduce(t, group=whole)
        out = [t.item()]
        if r in (0, 1):
            u = torch.tensor([r + 1.0])
            dist.all_reduce(u, group=pair)
            out.append(u.item())
        dist.destroy_process_group()
        return out

    return in_rank_threads(rank, 30)


def die_at(step: str) -> None:
    """Make this rank die at ``step`` of the next reload (or right before it)."""
    import os

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if step == "world":
        dist.init_process_group = lambda *a, **k: os._exit(0)  # restoring WORLD
    elif step == "creation":
        helper = c10d._new_process_group_helper
        calls = []

        def dying(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            if len(calls) == 2:  # during its second group creation
                os._exit(0)
            return helper(*args, **kwargs)

        c10d._new_process_group_helper = dying
