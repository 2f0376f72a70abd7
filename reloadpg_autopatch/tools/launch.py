"""Start N ranks as fresh interpreters on one machine and watch them until they all finish.

The launcher owns the rendezvous ``TCPStore`` (port 0 lets the kernel pick a free one), so a
busy port is reported before any rank starts. Ranks talk back through tagged JSON lines on
stdout (``emit``, in ``rank`` with the rest of the rank side); ``init_rank`` says "up" before it
joins. Any rank that exits non-zero, or any rank still running at the deadline, stops every rank
and raises ``LaunchError`` naming the rank: a multi-process run never hangs. The deadline starts
before the first rank does, so starting the ranks counts too, and ranks that never came up are
named as such.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .rank import EVENT_TAG, HOST, emit, fail, init_rank, rank_parser

# The rank side is ``rank``'s; its names are also this module's, where the ranks look them up.
__all__ = [
    "EVENT_TAG",
    "HOST",
    "LaunchError",
    "PortInUse",
    "RankOutcome",
    "emit",
    "fail",
    "init_rank",
    "launch",
    "rank_parser",
]


class LaunchError(RuntimeError):
    """A rank failed, died or hung; ``rank`` names it when one rank is to blame."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


class PortInUse(LaunchError):
    """The requested rendezvous port is taken."""


@dataclass
class RankOutcome:
    """What one rank reported and how it ended."""

    rank: int
    returncode: int | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    stderr: collections.deque = field(default_factory=lambda: collections.deque(maxlen=40))


# ---- launcher side ---------------------------------------------------------------------


def _store_server(host: str, port: int, world_size: int) -> Any:
    import torch.distributed as dist

    try:
        return dist.TCPStore(host, port, world_size, is_master=True, wait_for_workers=False)
    except Exception as error:
        text = str(error).lower()
        if port and ("in use" in text or "address already" in text or "bind" in text):
            raise PortInUse(
                f"port {port} on {host} is already in use; choose another with --port, or "
                "leave --port out to use a free one"
            ) from error
        raise LaunchError(f"cannot start the rendezvous store on {host}:{port}: {error}") from error


def _read(stream: Any, rank: int, channel: str, events: queue.Queue) -> None:
    for line in stream:
        events.put((rank, channel, line.rstrip("\n")))
    events.put((rank, "eof", channel))


def _stop(procs: Sequence[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _tail(outcome: RankOutcome, lines: int = 12) -> str:
    text = "\n".join(list(outcome.stderr)[-lines:])
    return f"\n--- rank {outcome.rank} stderr (last lines) ---\n{text}" if text else ""


def launch(
    command: Sequence[str],
    world_size: int,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 120.0,
    port: int = 0,
    host: str = HOST,
    on_event: Callable[[int, dict[str, Any]], None] | None = None,
    cwd: str | None = None,
) -> list[RankOutcome]:
    """Run ``command --rank R --world-size N --host H --port P`` for every rank.

    Returns each rank's events once all ranks exited with code 0. Raises ``PortInUse`` for a
    taken ``port`` and ``LaunchError`` for a rank that failed, died, did not come up or outlived
    ``timeout``, which counts from the start of this call: starting the ranks takes part of it.
    """
    deadline = time.monotonic() + timeout
    server = _store_server(host, port, world_size)
    outcomes = [RankOutcome(rank) for rank in range(world_size)]
    lines: queue.Queue = queue.Queue()
    procs: list[subprocess.Popen] = []
    try:
        for rank in range(world_size):
            if time.monotonic() > deadline:
                _drain(lines, outcomes, grace=0.0)
                silent = [o.rank for o in outcomes if not o.events]
                raise LaunchError(
                    f"{_ranks(silent)} did not come up within {timeout:g} s (only {rank} of "
                    f"{world_size} ranks could be started in that time); stopped them all",
                    rank=silent[0] if len(silent) == 1 else None,
                )
            argv = [*command, "--rank", str(rank), "--world-size", str(world_size)]
            argv += ["--host", host, "--port", str(server.port)]
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env if env is not None else dict(os.environ),
                cwd=cwd,
            )
            procs.append(proc)
            for channel, stream in (("out", proc.stdout), ("err", proc.stderr)):
                threading.Thread(
                    target=_read, args=(stream, rank, channel, lines), daemon=True
                ).start()
        _watch(procs, outcomes, lines, deadline=deadline, timeout=timeout, on_event=on_event)
    finally:
        _stop(procs)
        del server
    return outcomes


def _watch(
    procs: Sequence[subprocess.Popen],
    outcomes: list[RankOutcome],
    lines: queue.Queue,
    *,
    deadline: float,
    timeout: float,
    on_event: Callable[[int, dict[str, Any]], None] | None,
) -> None:
    open_streams = 2 * len(procs)
    closed: list[int] = []  # ranks in the order their output ended: the order they exited
    while open_streams:
        try:
            rank, channel, line = lines.get(timeout=0.2)
        except queue.Empty:
            rank = None
        if rank is not None:
            outcome = outcomes[rank]
            if channel == "eof":
                open_streams -= 1
                closed.append(rank)
            elif channel == "out" and line.startswith(EVENT_TAG):
                event = _event(rank, line)
                outcome.events.append(event)
                if on_event is not None:
                    on_event(rank, event)
            elif line:
                outcome.stderr.append(line)
        if any(p.poll() not in (None, 0) for p in procs):
            # Let the dying ranks' last words (error events, tracebacks) and the end of their
            # output arrive, then blame the first to exit: the others may only have lost it.
            _drain(lines, outcomes, closed=closed)
            failed = [o for o, p in zip(outcomes, procs, strict=True) if p.poll() not in (None, 0)]
            first = min(failed, key=lambda o: closed.index(o.rank) if o.rank in closed else 2**31)
            first.returncode = code = procs[first.rank].poll()
            reason = _failure_reason(first)
            raise LaunchError(
                f"rank {first.rank} failed (exit code {code}): {reason}{_tail(first)}",
                rank=first.rank,
            )
        if time.monotonic() > deadline:
            running = [o for o, p in zip(outcomes, procs, strict=True) if p.poll() is None]
            silent = [o.rank for o in running if not o.events]
            if silent:
                what = f"{_ranks(silent)} did not come up"
                blamed = silent
            elif running:
                blamed = [o.rank for o in running]
                what = f"{_ranks(blamed)} did not finish"
            else:
                blamed, what = [], "the ranks' output did not end"
            raise LaunchError(
                f"{what} within {timeout:g} s; stopped them all",
                rank=blamed[0] if len(blamed) == 1 else None,
            )
    for outcome, proc in zip(outcomes, procs, strict=True):
        outcome.returncode = proc.wait()


def _event(rank: int, line: str) -> dict[str, Any]:
    try:
        event = json.loads(line[len(EVENT_TAG) :])
    except ValueError as error:
        raise LaunchError(f"rank {rank} sent a malformed event: {line!r}", rank=rank) from error
    if not isinstance(event, dict) or "type" not in event:
        raise LaunchError(f"rank {rank} sent an event without a type: {line!r}", rank=rank)
    return event


def _drain(
    lines: queue.Queue,
    outcomes: list[RankOutcome],
    grace: float = 1.0,
    closed: list[int] | None = None,
) -> None:
    """Take in what is queued and what the ranks say for ``grace`` more seconds."""
    end = time.monotonic() + grace
    pending = lines.qsize()
    while pending > 0 or time.monotonic() < end:
        try:
            rank, channel, line = lines.get(timeout=0.05)
        except queue.Empty:
            pending = 0
            continue
        pending -= 1
        if channel == "eof":
            if closed is not None:
                closed.append(rank)
        elif channel == "out" and line.startswith(EVENT_TAG):
            outcomes[rank].events.append(_event(rank, line))
        elif line:
            outcomes[rank].stderr.append(line)


def _failure_reason(outcome: RankOutcome) -> str:
    for event in reversed(outcome.events):
        if event.get("type") == "error":
            return str(event.get("message"))
    if outcome.returncode is not None and outcome.returncode < 0:
        return f"killed by signal {-outcome.returncode}"
    last = [line for line in outcome.stderr if line.strip()]
    return last[-1] if last else "no output"
