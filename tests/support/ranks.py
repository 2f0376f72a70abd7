"""Run a function on N gloo ranks on 127.0.0.1, forked from a warm parent or freshly spawned.

The test process owns the TCPStore server (port 0: the kernel picks a free port, so parallel
runs never collide) and joins every rank against one deadline: a rank that hangs, dies or
raises fails the test with its rank number and traceback, and the other ranks are killed.

By default each rank is a child forked from a warm parent (``tests/support/warm.py``): an
interpreter started with the test's environment that has already imported torch. With
``fresh=True`` each rank is a freshly spawned interpreter, for the tests whose subject is what
happens before torch is imported (start-up, the gate, spawn itself); each such test says why.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import queue
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

HOST = "127.0.0.1"
#: The gate on: what a user sets in a Ray ``runtime_env``.
GATE = {"SLIME_RELOADABLE_PG": "1"}


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

    def begin(
        self,
        *,
        gate: bool = True,
        policy: str = "all",
        world: bool = False,
        swap: tuple[str, ...] | None = ("gloo",),
        timeout: float = 30.0,
    ) -> Any:
        """Join WORLD in a rank the gate patched at start-up; return torch.distributed.

        ``gate``: assert that the gate patched this rank. ``policy``: the wrap policy.
        ``world``: register WORLD with ``accelerator_backends=swap``: gloo by default, so that
        WORLD sleeps and wakes on CPU as an NCCL WORLD does on a GPU.
        """
        import warnings
        from datetime import timedelta

        import torch.distributed as dist

        import reloadpg_autopatch as rpg

        warnings.simplefilter("ignore", FutureWarning)
        if gate:
            assert rpg.is_patched(), "the gate did not patch this rank at start-up"
        rpg.set_wrap_policy(policy)
        self.init(timeout=timeout)
        if world:
            rpg.register_default_process_group(
                timedelta(seconds=timeout), accelerator_backends=swap
            )
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


def total(group: Any, value: float) -> float:
    """``value`` summed over ``group`` (None: WORLD) by an all_reduce: this rank's check that a
    group works."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([value])
    dist.all_reduce(t, group=group)
    return t.item()


def pg_count() -> int:
    """The groups torch holds in ``_world.pg_map`` (WORLD included)."""
    from torch.distributed import distributed_c10d

    return len(distributed_c10d._world.pg_map)


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


class _Spawned:
    """Ranks as freshly spawned interpreters; what they say comes through one queue."""

    def __init__(self, fn: Callable[[Rank], Any], infos: list[Rank], env: Any) -> None:
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.procs = []
        self.reported: set[int] = set()
        with environment(env):
            for info in infos:
                proc = ctx.Process(target=_entry, args=(fn, info, self.results), daemon=True)
                proc.start()
                self.procs.append(proc)

    def events(self, wait: float) -> list[tuple]:
        """``("result", rank, ok, value)`` and ``("exit", rank, code)``, in the order they came."""
        try:
            rank, ok, value = self.results.get(timeout=wait)
        except queue.Empty:
            pass
        else:
            self.reported.add(rank)
            return [("result", rank, ok, value)]
        out = []
        for rank, proc in enumerate(self.procs):
            if proc.exitcode is not None and rank not in self.reported:
                # Give a dying rank's report a moment to arrive through the queue.
                with contextlib.suppress(queue.Empty):
                    late, ok, value = self.results.get(timeout=2)
                    self.reported.add(late)
                    return [("result", late, ok, value)]
                self.reported.add(rank)
                out.append(("exit", rank, proc.exitcode))
        return out

    def end(self, finished: bool) -> None:
        for proc in self.procs:
            proc.join(timeout=5 if finished else 0.1)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)


class _Forked:
    """Ranks forked from the warm parent for ``env`` and ``preload``."""

    def __init__(
        self, fn: Callable[[Rank], Any], infos: list[Rank], env: Any, preload: tuple[str, ...]
    ) -> None:
        from tests.support import warm

        self.parent = warm.parent_for(env, preload)
        self.parent.start(fn, infos)
        self.done = False

    def events(self, wait: float) -> list[tuple]:
        message = self.parent.receive(wait)
        if message is None:
            return []
        if message[0] == "done":
            self.done = True
            return []
        if message[0] == "result":
            ok, value = pickle.loads(message[2])  # noqa: S301 - our own ranks' results
            return [("result", message[1], ok, value)]
        return [message]  # ("exit", rank, code)

    def end(self, finished: bool) -> None:
        # Let the ranks end on their own for a few seconds, as spawned ranks always could.
        deadline = time.monotonic() + (5 if finished else 0)
        while not self.done and time.monotonic() < deadline:
            self.events(0.5)
        if not self.done:
            self.parent.kill_run()


#: ``run_ranks_once``'s runs by their arguments: what each returned, or the failure it raised.
_ONCE: dict[tuple[Any, ...], tuple[bool, Any]] = {}


def run_ranks_once(
    fn: Callable[[Rank], Any],
    world_size: int = 2,
    *,
    timeout: float = 90.0,
    env: dict[str, str | None] | None = None,
    store_in_rank0: bool = False,
) -> list[Any]:
    """``run_ranks`` once per session for the same arguments: the tests that check one run's
    report from several sides share it, and each of them meets its failure, if any."""
    key = (
        fn.__module__,
        fn.__qualname__,
        world_size,
        tuple(sorted((env or {}).items(), key=lambda item: item[0])),
        store_in_rank0,
    )
    if key not in _ONCE:
        try:
            _ONCE[key] = (
                True,
                run_ranks(fn, world_size, timeout=timeout, env=env, store_in_rank0=store_in_rank0),
            )
        except RankFailure as error:
            _ONCE[key] = (False, error)
    ok, value = _ONCE[key]
    if not ok:
        raise value
    return value


def run_ranks(
    fn: Callable[[Rank], Any],
    world_size: int = 2,
    *,
    timeout: float = 90.0,
    env: dict[str, str | None] | None = None,
    store_in_rank0: bool = False,
    may_die: frozenset[int] = frozenset(),
    fresh: bool = False,
    preload: tuple[str, ...] = (),
) -> list[Any]:
    """Run ``fn(Rank)`` on every rank; return the results in rank order.

    ``env`` sets (``None``: unsets) variables for the ranks from their start, so the ``.pth``
    gate reads them. ``store_in_rank0``: rank 0 hosts the store (``Rank.store_host``), as
    torchrun's does, so a test can kill it. Ranks in ``may_die`` may exit without a report;
    their result is None. ``preload``: modules the warm parent imports besides torch, only
    where importing them before the rank function runs changes nothing the test checks.
    ``fresh``: spawn a fresh interpreter per rank (see the module's docstring).
    """
    import torch.distributed as dist

    server = None
    if store_in_rank0:
        port = _free_port()
    else:
        server = dist.TCPStore(HOST, 0, world_size, is_master=True, wait_for_workers=False)
        port = server.port
    infos = [
        Rank(rank, world_size, port, store_host=store_in_rank0 and rank == 0)
        for rank in range(world_size)
    ]
    ranks = _Spawned(fn, infos, env) if fresh else _Forked(fn, infos, env, preload)
    outcome: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(outcome) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(world_size)) - set(outcome))
                raise RankFailure(f"ranks {missing} did not finish within {timeout:.0f} s")
            died = {}
            for event in ranks.events(min(remaining, 0.5)):
                if event[0] == "result":
                    _, rank, ok, value = event
                    outcome[rank] = (ok, value)
                    if not ok:
                        raise RankFailure(f"rank {rank} failed:\n{value}")
                elif event[1] not in outcome:
                    if event[1] in may_die:
                        outcome[event[1]] = (True, None)
                    else:
                        died[event[1]] = event[2]
            if died:
                raise RankFailure(f"ranks died without a report (exit codes {died})")
    finally:
        ranks.end(finished=len(outcome) == world_size)
        del server
    return [outcome[r][1] for r in range(world_size)]
