"""The ranks of one run: each a fresh interpreter in a process session of its own, read as it
reports, stopped at its deadline, or when a peer died, and killed as a group."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .common import DEMO_TAG, FLUSH_S, GATE, HOST, PEER_GRACE_S, RANKS, REAP_S, ROOT, TAG
from .plan import Run


class Interrupted(Exception):
    """SIGTERM or SIGINT reached this script: stop the ranks, write what there is, exit."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def _base_env() -> dict[str, str]:
    """This environment without the package's variables: a run adds the ones it means."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(GATE)}
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("PYTHONWARNINGS", "ignore::FutureWarning,ignore::UserWarning")
    return env


def _read(stream: Any, rank: int, channel: str, lines: queue.Queue) -> None:
    for line in stream:
        lines.put((rank, channel, line.rstrip("\n")))
    lines.put((rank, "eof", channel))


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Ranks:
    """The ranks of one run, each in a session of its own; ``stop`` kills every group."""

    def __init__(self, run: Run, rehearse: bool, on_news: Callable[[], None] | None = None) -> None:
        self.run, self.rehearse, self.on_news = run, rehearse, on_news
        self.news = False  # a rank reported something not yet passed to ``on_news``
        self.told = 0.0
        self.procs: list[subprocess.Popen] = []
        self.running_at_end: list[int] = []
        self.left: list[int] = []  # ranks (or their groups) still there after the kill
        self.lines: queue.Queue = queue.Queue()
        self.ranks = [
            {
                "rank": r,
                "exit_code": None,
                "data": {},
                "checks": [],
                "events": [],
                "stderr_tail": collections.deque(maxlen=20),
            }
            for r in range(run.world_size)
        ]

    def start(self) -> list[int]:
        port = _free_port()
        env = {**_base_env(), **self.run.env}
        for rank in range(self.run.world_size):
            argv = [sys.executable, str(RANKS), "--rank-program", self.run.program]
            argv += ["--rank", str(rank), "--world-size", str(self.run.world_size)]
            argv += ["--port", str(port), "--deadline", repr(self.run.deadline_s)]
            argv += ["--parent", str(os.getpid()), *self.run.options]
            argv += ["--rehearse"] if self.rehearse else []
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=str(ROOT),
                start_new_session=True,  # its own session and process group: killed as one
            )
            self.procs.append(proc)
            for channel, stream in (("out", proc.stdout), ("err", proc.stderr)):
                threading.Thread(
                    target=_read, args=(stream, rank, channel, self.lines), daemon=True
                ).start()
        return [p.pid for p in self.procs]

    def watch(self) -> str:
        """Until every rank ended or the deadline: "ok", "crashed" or "timeout".

        ``running_at_end`` then names the ranks that were still running when it stopped them.
        """
        deadline = time.monotonic() + self.run.deadline_s
        open_streams = 2 * len(self.procs)
        first_failure: float | None = None
        ended_at: float | None = None
        outcome = "ok"
        while open_streams:
            try:
                rank, channel, line = self.lines.get(timeout=0.1)
            except queue.Empty:
                rank = None
            if rank is not None:
                if channel == "eof":
                    open_streams -= 1
                else:
                    self._take(rank, channel, line)
            now = time.monotonic()
            if self.news and self.on_news is not None and now - self.told >= FLUSH_S:
                self.news, self.told = False, now
                self.on_news()
            codes = [p.poll() for p in self.procs]
            if first_failure is None and any(c not in (None, 0) for c in codes):
                first_failure = now
            if all(c is not None for c in codes):
                ended_at = ended_at or now
                if now - ended_at > REAP_S / 2:  # a grandchild holds the pipes: stop waiting
                    break
            late = first_failure is not None and now - first_failure > PEER_GRACE_S
            if late and any(c is None for c in codes):
                outcome = "crashed"
                break
            if now > deadline:
                outcome = "timeout"
                break
        self.running_at_end = [r for r, p in enumerate(self.procs) if p.poll() is None]
        self.left = self.stop()
        self._drain()
        for entry, proc in zip(self.ranks, self.procs, strict=True):
            entry["exit_code"] = proc.poll()
        if outcome == "ok" and any(e["exit_code"] != 0 for e in self.ranks):
            outcome = "crashed"
        return outcome

    def stop(self) -> list[int]:
        """Kill every rank's process group, reap the ranks; the pids of groups still alive."""
        for proc in self.procs:
            _kill_group(proc.pid)
        reaped_by = time.monotonic() + REAP_S  # one allowance for every rank of the run
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(reaped_by - time.monotonic(), 0.01))
        left = [p.pid for p in self.procs if p.poll() is None or _group_alive(p.pid)]
        for pgid in left:
            _kill_group(pgid)
        return left

    def _drain(self) -> None:
        while True:
            try:
                rank, channel, line = self.lines.get_nowait()
            except queue.Empty:
                return
            if channel != "eof":
                self._take(rank, channel, line)

    def _take(self, rank: int, channel: str, line: str) -> None:
        entry = self.ranks[rank]
        self.news = True
        for tag in (TAG, DEMO_TAG):
            if channel == "out" and line.startswith(tag):
                try:
                    event = json.loads(line[len(tag) :])
                except ValueError:
                    entry["stderr_tail"].append(f"(malformed event) {line[:300]}")
                    return
                if event.get("type") == "data":
                    entry["data"].update({k: v for k, v in event.items() if k != "type"})
                elif event.get("type") == "check":
                    entry["checks"].append({k: v for k, v in event.items() if k != "type"})
                else:
                    entry["events"].append(event)
                return
        if line.strip():
            entry["stderr_tail"].append(line[:500])
