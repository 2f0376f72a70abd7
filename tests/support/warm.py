"""Warm parents: rank processes forked from an interpreter that has already imported torch.

Spawning a fresh interpreter per rank costs an import of torch (about 1 s on the CPU build,
more on 2.14.1's CUDA build) and of the test module, two to eight times per test. A warm parent
pays that once. It is itself a freshly spawned interpreter, started with exactly the
environment the ranks would have had, so the ``.pth`` gate activates it (or not) exactly as it
would a rank; it imports torch, where the package's import hook fires as it would in the rank,
and then forks one child per rank. To the code under test a forked rank is a fresh interpreter
that imported torch first: it holds no group, thread or store of its parent's, and the
package's fork reset finds no WORLD to remember.

One parent serves every run with the same environment, working directory, ``sys.path`` and
preloads; ``KEEP`` stay warm, the least recently used going first. A parent that dies or stops
answering is dropped, the run fails naming it, and the next run starts another.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import signal
import sys
import traceback
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

#: Parents kept warm at once; each holds an imported torch (0.2 GB, 0.65 GB on 2.14.1).
KEEP = 6
#: Seconds a new parent may take to import torch and its preloads, and to answer a request.
ANSWER_S = 180.0
#: Variables that differ from test to test without changing what a rank is.
NOT_KEYED = ("PYTEST_CURRENT_TEST",)


class ParentLost(RuntimeError):
    """A warm parent died or stopped answering; it was dropped."""


# ---- inside the warm parent ------------------------------------------------------------------


def _serve(conn: mpc.Connection, preload: tuple[str, ...]) -> None:
    """Import what every rank imports first, then fork the ranks of each run asked for."""
    import torch  # noqa: F401 - what a rank imports first, and where the gate's hook fires

    for name in preload:
        importlib.import_module(name)
    mp.current_process().daemon = False  # the ranks are this process's children
    conn.send(("ready",))
    fork = mp.get_context("fork")
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "stop":
            return
        if message[0] != "run":
            continue  # a kill that came after its run had ended
        try:
            fn = pickle.loads(message[1])  # noqa: S301 - imports the test module here, once
        except BaseException:
            conn.send(("refused", traceback.format_exc()))
            continue
        _Run(conn, fork, fn, *message[2:]).relay()


class _Run:
    """One run's ranks, forked; what each says and how it ends is relayed until all ended."""

    def __init__(
        self, conn: mpc.Connection, fork: Any, fn: Callable, infos: list, *where: Any
    ) -> None:
        self.conn = conn
        self.procs: dict[int, Any] = {}
        self.readers: dict[Any, int] = {}
        for info in infos:
            reader, writer = fork.Pipe(duplex=False)
            proc = fork.Process(target=_rank, args=(fn, info, writer, *where), daemon=True)
            proc.start()
            writer.close()
            self.procs[info.rank] = proc
            self.readers[reader] = info.rank
        conn.send(("started", {rank: proc.pid for rank, proc in self.procs.items()}))

    def relay(self) -> None:
        sentinels = {proc.sentinel: rank for rank, proc in self.procs.items()}
        while sentinels:
            for handle in mpc.wait([self.conn, *self.readers, *sentinels]):
                if handle is self.conn:
                    self._command()
                elif handle in self.readers:
                    self._read(handle)
                elif handle in sentinels:
                    self._ended(sentinels.pop(handle))
        self.conn.send(("done",))

    def _command(self) -> None:
        try:
            message = self.conn.recv()
        except (EOFError, OSError):
            message = ("kill",)
        if message[0] == "kill":
            for proc in self.procs.values():
                if proc.exitcode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGKILL)

    def _read(self, reader: Any, wait: float = 0.0) -> None:
        rank = self.readers[reader]
        try:
            while reader.poll(wait):
                self.conn.send(("result", rank, reader.recv_bytes()))
                if not wait:
                    return
        except (EOFError, OSError):
            pass
        else:
            if not wait:
                return
        del self.readers[reader]
        reader.close()

    def _ended(self, rank: int) -> None:
        proc = self.procs[rank]
        proc.join()
        # Its last words were written before it exited; a grandchild may still hold the pipe
        # open, so read what is there rather than wait for the end of it.
        for reader, owner in list(self.readers.items()):
            if owner == rank:
                self._read(reader, wait=0.2)
        self.conn.send(("exit", rank, proc.exitcode))


def _rank(fn: Callable, info: Any, writer: mpc.Connection, cwd: str, path: list) -> None:
    """A forked rank: run ``fn``, send its result, and end as a spawned rank ends."""
    os.chdir(cwd)
    sys.path[:] = path
    ok = True
    try:
        try:
            payload = pickle.dumps((True, fn(info)))
        except BaseException:
            ok = False
            payload = pickle.dumps((False, traceback.format_exc()))
        writer.send_bytes(payload)
        writer.close()
    finally:
        # A spawned rank ends through sys.exit, which runs the atexit callbacks; a forked one
        # ends through os._exit: run them here so that both end alike.
        atexit._run_exitfuncs()
    if not ok:
        raise SystemExit(1)


# ---- in the test process ---------------------------------------------------------------------


class WarmParent:
    """One warm parent process and the connection to it."""

    def __init__(self, key: tuple, env: dict[str, str], preload: tuple[str, ...]) -> None:
        ctx = mp.get_context("spawn")
        self.key = key
        self.conn, theirs = ctx.Pipe()
        saved = dict(os.environ)
        try:  # spawn copies os.environ: make it exactly the ranks' while the parent starts
            os.environ.clear()
            os.environ.update(env)
            self.proc = ctx.Process(target=_serve, args=(theirs, preload), daemon=True)
            self.proc.start()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        theirs.close()
        self.pids: dict[int, int] = {}
        self._expect("ready", "starting")

    def _expect(self, kind: str, doing: str) -> tuple:
        message = self.receive(ANSWER_S)
        if message is None:
            self.close()
            raise ParentLost(f"the warm parent did not answer within {ANSWER_S:g} s {doing}")
        if message[0] != kind:
            self.close()
            raise ParentLost(f"the warm parent answered {message[0]!r} {doing}:\n{message[1:]}")
        return message

    def receive(self, wait: float) -> tuple | None:
        """The next message, None after ``wait`` seconds of silence, or ``ParentLost``."""
        try:
            if not self.conn.poll(wait):
                if self.proc.is_alive():
                    return None
                raise EOFError
            return self.conn.recv()
        except (EOFError, OSError):
            self.close()
            raise ParentLost(
                f"the warm parent (pid {self.proc.pid}) died (exit code {self.proc.exitcode})"
            ) from None

    def start(self, fn: Callable, infos: list) -> None:
        """Fork one child per rank of ``infos`` to run ``fn``."""
        self.conn.send(("run", pickle.dumps(fn), infos, os.getcwd(), list(sys.path)))
        self.pids = self._expect("started", "to a run")[1]

    def kill_run(self) -> None:
        """Kill every rank of the run now, then read the rest of the run."""
        self._kill_ranks()
        with contextlib.suppress(OSError):
            self.conn.send(("kill",))
        while True:
            message = self.receive(10)
            if message is None:
                self.close()
                raise ParentLost("the warm parent did not end a run it was told to kill")
            if message[0] == "done":
                self.pids = {}
                return

    def _kill_ranks(self) -> None:
        for pid in self.pids.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        """Stop this parent and its ranks, and forget it."""
        if _PARENTS.get(self.key) is self:
            del _PARENTS[self.key]
        self._kill_ranks()
        with contextlib.suppress(OSError):
            self.conn.send(("stop",))
        self.proc.join(timeout=2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
        self.conn.close()


_PARENTS: OrderedDict[tuple, WarmParent] = OrderedDict()


def parent_for(env: dict[str, str | None] | None, preload: tuple[str, ...] = ()) -> WarmParent:
    """The warm parent for this environment (``None`` unsets a variable) and these preloads."""
    full = dict(os.environ)
    for name, value in (env or {}).items():
        if value is None:
            full.pop(name, None)
        else:
            full[name] = value
    keyed = tuple(sorted((k, v) for k, v in full.items() if k not in NOT_KEYED))
    key = (keyed, os.getcwd(), tuple(sys.path), tuple(preload))
    parent = _PARENTS.get(key)
    if parent is not None and parent.proc.is_alive():
        _PARENTS.move_to_end(key)
        return parent
    if parent is not None:
        parent.close()
    while len(_PARENTS) >= KEEP:
        next(iter(_PARENTS.values())).close()
    parent = WarmParent(key, full, tuple(preload))
    _PARENTS[key] = parent
    return parent


def close_all() -> None:
    """Stop every warm parent (at the end of the session)."""
    for parent in list(_PARENTS.values()):
        parent.close()


atexit.register(close_all)
