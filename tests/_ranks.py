"""Run a function on N gloo ranks, each a freshly spawned interpreter on 127.0.0.1.

The parent owns the TCPStore server (port 0: the kernel picks a free port, so parallel runs
never collide) and joins every rank against one deadline: a rank that hangs, dies or raises
fails the test with its rank number and traceback, and the other ranks are killed.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

HOST = "127.0.0.1"


@dataclass
class Rank:
    """What a rank function gets: its rank, the world size, and how to join the store."""

    rank: int
    world_size: int
    port: int
    host: str = HOST
    #: This rank hosts the store (``run_ranks(store_in_rank0=True)``).
    store_host: bool = False

    def patched(self, policy: str = "all") -> Any:
        """Patch torch.distributed, choose the wrap policy, join WORLD; return the module."""
        import warnings

        import reloadpg_autopatch

        warnings.simplefilter("ignore", FutureWarning)
        reloadpg_autopatch.monkey_patch_torch_dist()
        reloadpg_autopatch.set_wrap_policy(policy)
        self.init()
        import torch.distributed as dist

        return dist

    def init(self, backend: str = "gloo", timeout: float = 30.0) -> None:
        from reloadpg_autopatch.tools.launch import init_rank

        init_rank(self, backend=backend, timeout=timeout)

    def reinit(self, prefix: str, timeout: Any, store_timeout: Any = None) -> None:
        """Start a second gloo WORLD on the launcher's store, under a key prefix of its own.

        For tests where the program (or torch behind our back) ended the first WORLD.
        """
        import torch.distributed as dist

        extra = {} if store_timeout is None else {"timeout": store_timeout}
        store = dist.TCPStore(self.host, self.port, self.world_size, is_master=False, **extra)
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(prefix, store),
            rank=self.rank,
            world_size=self.world_size,
            timeout=timeout,
        )


def errors_of(calls: dict[str, Callable[[], Any]]) -> dict[str, str]:
    """Run each call; map its label to the RuntimeError's text, or "no error"."""
    errors = {}
    for label, call in calls.items():
        try:
            call()
            errors[label] = "no error"
        except RuntimeError as error:
            errors[label] = str(error)
    return errors


@contextlib.contextmanager
def environment(env: dict[str, str | None] | None) -> Iterator[None]:
    """Set (or, with None, unset) variables while children start: spawn copies os.environ."""
    saved = {key: os.environ.get(key) for key in env or {}}
    try:
        for key, value in (env or {}).items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _entry(fn: Callable[[Rank], Any], rank: Rank, results: Any) -> None:
    try:
        results.put((rank.rank, True, fn(rank)))
    except BaseException:
        results.put((rank.rank, False, traceback.format_exc()))
        raise SystemExit(1) from None


class RankFailure(AssertionError):
    """One or more ranks failed, hung or died."""


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def run_ranks(
    fn: Callable[[Rank], Any],
    world_size: int = 2,
    *,
    timeout: float = 90.0,
    env: dict[str, str | None] | None = None,
    store_in_rank0: bool = False,
    may_die: frozenset[int] = frozenset(),
) -> list[Any]:
    """Run ``fn(Rank)`` on every rank; return the results in rank order.

    ``store_in_rank0``: rank 0 hosts the store (``Rank.store_host``), as torchrun's does, so a
    test can kill it. Ranks in ``may_die`` may exit without a report; their result is None.
    """
    import torch.distributed as dist

    server = None
    if store_in_rank0:
        port = _free_port()
    else:
        server = dist.TCPStore(HOST, 0, world_size, is_master=True, wait_for_workers=False)
        port = server.port
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = []
    with environment(env):
        for rank in range(world_size):
            info = Rank(rank, world_size, port, store_host=store_in_rank0 and rank == 0)
            proc = ctx.Process(target=_entry, args=(fn, info, results), daemon=True)
            proc.start()
            procs.append(proc)
    outcome: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(outcome) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(world_size)) - set(outcome))
                raise RankFailure(f"ranks {missing} did not finish within {timeout:.0f} s")
            try:
                rank, ok, value = results.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                for r in may_die:
                    if r not in outcome and procs[r].exitcode is not None:
                        outcome[r] = (True, None)
                dead = [
                    r for r, p in enumerate(procs) if r not in outcome and p.exitcode is not None
                ]
                if dead:
                    # Give a dying rank's report a moment to arrive through the queue.
                    with contextlib.suppress(queue.Empty):
                        rank, ok, value = results.get(timeout=2)
                        outcome[rank] = (ok, value)
                        continue
                    codes = {r: procs[r].exitcode for r in dead}
                    raise RankFailure(f"ranks died without a report (exit codes {codes})") from None
                continue
            outcome[rank] = (ok, value)
            if not ok:
                raise RankFailure(f"rank {rank} failed:\n{value}")
    finally:
        for proc in procs:
            proc.join(timeout=5 if len(outcome) == world_size else 0.1)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        del server
    return [outcome[r][1] for r in range(world_size)]
