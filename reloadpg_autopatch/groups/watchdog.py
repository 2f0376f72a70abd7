"""The watchdog: a call that may wait in NCCL without a timeout never becomes a silent hang.

A suspend, a resume and (from NCCL 2.31 on) every communicator's destroy are collective inside
NCCL, with no timeout. The store rounds around them make every rank arrive together; a call that
outlives its deadline is then stuck for good, and the watchdog acts: by default it ends the
process with the stacks, as torch's NCCL watchdog does; a caller may give it another action
(``frees`` aborts the stuck communicator and names the ranks that never came).

One thread per process, started by the first call it watches and stopped once nothing sleeps
(``idle``): a call arms a deadline and disarms it, under one lock, with no thread started per
call. Nothing the program may own is taken: not faulthandler's one timer per process (a training
program's own hang detector, ``faulthandler.dump_traceback_later``, which no one can read back to
restore), not a signal handler, not ``SIGALRM``'s interval timer, not ``sys.excepthook``. Its
backstop, for a call that holds the GIL so that no Python thread can run, is a POSIX per-process
timer of its own (``timer_create``: a process may hold any number, each independent), created
once, armed for the earliest deadline and disarmed when nothing is watched.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from .. import _env
from .backstop import Backstop
from .backstop import backstop_signal as _backstop_signal  # noqa: F401 - read by the tests

logger = logging.getLogger("reloadpg_autopatch")


#: How long after the watchdog the backstop ends the process, should the watchdog itself not
#: run (the call holds the GIL).
BACKSTOP_S = 5.0
#: The longest timeout the watchdog times: the longest accepted (about 31 years), or less where
#: a thread cannot wait that long (``threading.TIMEOUT_MAX``, less the backstop's margin).
LONGEST_S = float(min(_env.LONGEST_SUSPEND_TIMEOUT_S, int(threading.TIMEOUT_MAX - BACKSTOP_S)))
#: How much earlier than its call's deadline plus ``BACKSTOP_S`` the backstop may fire, so
#: that calls in a row re-arm it about once a second, not once each.
SLACK_S = 1.0
#: The watchdog thread's name (tests and the whole-run benchmark count it).
THREAD_NAME = "reloadpg_autopatch-watchdog"


def suspend_timeout(world_timeout: timedelta) -> float:
    """Seconds one suspend, resume or free may take: ``SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT``,
    else WORLD's timeout (at most ``LONGEST_S``). A bad value is reported once per process, and
    WORLD's timeout is used."""
    raw = os.environ.get(_env.SUSPEND_TIMEOUT_ENV)
    if raw is not None and raw.strip():
        try:
            return min(_env.parse_suspend_timeout(raw), LONGEST_S)
        except ValueError as error:
            if _env.first_report(_env.SUSPEND_TIMEOUT_ENV, raw):
                logger.warning("%s; using WORLD's timeout instead", error)
    return min(world_timeout.total_seconds(), LONGEST_S)


def end_process(message: str) -> None:
    """Say ``message`` once (the log, or stderr where nothing handles the log), dump every
    thread's stack, and end the process.

    ``abort()`` ends it with SIGABRT even if the program handles SIGABRT in Python (its handler
    would only run once the stuck call returned).
    """
    with contextlib.suppress(Exception):
        if logger.hasHandlers():
            logger.critical("%s", message)
        else:  # nothing would show it: the one line goes to stderr itself
            sys.stderr.write(message + "\n")
        sys.stderr.flush()
        faulthandler.dump_traceback(all_threads=True)  # a one-time dump: no timer is touched
    os.abort()


def _expired(watch: Watch) -> None:
    """The default action: a suspend or resume stuck in NCCL ends the process."""
    end_process(
        f"reloadpg_autopatch: {watch.what} did not return within {watch.seconds:g} s "
        f"({_env.SUSPEND_TIMEOUT_ENV}, or WORLD's timeout). Every rank had passed the step's "
        "store sync, so a peer failed or hangs inside NCCL's barrier; NCCL cannot time it "
        "out, so this process ends here (as torch's NCCL watchdog does). Stacks follow."
    )


# ---- the one thread ----------------------------------------------------------------------------


class Watch:
    """One watched call: what it is, its deadline, and what happens when it passes."""

    __slots__ = ("deadline", "done", "expiry", "fired", "result", "seconds", "what")

    def __init__(self, what: str, seconds: float, expiry: Callable[[Watch], None]) -> None:
        self.what, self.seconds, self.expiry = what, seconds, expiry
        self.deadline = time.monotonic() + seconds
        #: Set once the deadline passed and the expiry action began (on the watchdog's thread).
        self.fired = False
        #: Set when the watched call returned or raised.
        self.done = threading.Event()
        #: What the expiry action found (``frees``: the ranks that never came).
        self.result: Any = None

    def extend(self, seconds: float) -> None:
        """The expiry action needs ``seconds`` more: keep the backstop off until then."""
        _DOG.push_backstop(seconds)


class _Dog:
    """The watchdog's state: the armed watches, its thread, the backstop; one lock."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.watches: list[Watch] = []
        self.thread: threading.Thread | None = None
        self.stopping = False
        self.backstop = Backstop()
        #: The deadline the thread sleeps until (inf: none); an earlier one must wake it.
        self.waking = float("inf")
        #: When the backstop is armed to fire (inf: not armed).
        self.fires = float("inf")

    def arm(self, watch: Watch) -> None:
        with self.cond:
            self.watches.append(watch)
            self.stopping = False
            self._rearm_backstop()
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
                self.thread.start()
            if watch.deadline < self.waking:  # a later one waits for the thread's next wake
                self.cond.notify()

    def disarm(self, watch: Watch) -> None:
        watch.done.set()
        with self.cond:
            if watch in self.watches:
                self.watches.remove(watch)
            self._rearm_backstop()  # the thread wakes at its deadline, and finds nothing due

    def push_backstop(self, seconds: float) -> None:
        with self.cond:
            self.backstop.arm(seconds + BACKSTOP_S)
            self.fires = time.monotonic() + seconds + BACKSTOP_S

    def _rearm_backstop(self) -> None:
        """Armed for the earliest pending deadline, give or take ``SLACK_S`` (a re-arm per call
        would cost more than the call's own bookkeeping); disarmed once nothing is watched."""
        pending = [w.deadline for w in self.watches if not w.fired]
        if pending:
            fires = min(pending) + BACKSTOP_S
            if not fires - SLACK_S <= self.fires <= fires:
                self.backstop.arm(fires - time.monotonic())
                self.fires = fires
        elif not self.watches and self.fires != float("inf"):
            self.backstop.disarm()
            self.fires = float("inf")
        # else: an expiry action runs, and pushed the backstop out itself (``Watch.extend``)

    def stop_if_idle(self) -> None:
        """End the thread if nothing is watched: gone when this returns (it only has to wake)."""
        with self.cond:
            thread = self.thread
            if self.watches or thread is None or thread is threading.current_thread():
                return
            self.stopping = True
            self.cond.notify()
        thread.join(timeout=1.0)

    def _run(self) -> None:
        while True:
            with self.cond:
                due = None
                while due is None:
                    if self.stopping and not self.watches:
                        self.thread = None
                        return
                    pending = [w for w in self.watches if not w.fired]
                    if not pending:
                        self.waking = float("inf")
                        self.cond.wait()
                        continue
                    first = min(pending, key=lambda w: w.deadline)
                    left = first.deadline - time.monotonic()
                    if left > 0:
                        self.waking = first.deadline
                        self.cond.wait(left)
                        continue
                    due = first
                    due.fired = True
            try:
                due.expiry(due)
            except BaseException as error:
                logger.error("the watchdog's action for %s failed: %r", due.what, error)


_DOG = _Dog()


def _reset_in_child() -> None:
    """A forked child has no watchdog thread, and its parent's POSIX timer is not its own."""
    global _DOG
    _DOG = _Dog()


os.register_at_fork(after_in_child=_reset_in_child)


@contextlib.contextmanager
def watched(
    what: str, seconds: float, expiry: Callable[[Watch], None] | None = None
) -> Iterator[Watch]:
    """Act if the block runs longer than ``seconds`` (``what`` names it): ``expiry(watch)`` on
    the watchdog's thread, by default ending the process. A block that returns or raises leaves
    nothing armed."""
    watch = Watch(what, min(seconds, LONGEST_S), expiry or _expired)
    dog = _DOG
    dog.arm(watch)
    try:
        yield watch
    finally:
        dog.disarm(watch)


def idle() -> None:
    """Nothing sleeps any more in this process: the watchdog's thread ends (the next watched
    call starts it again)."""
    _DOG.stop_if_idle()


def call(backend: Any, op: str, what: str, seconds: float) -> float:
    """``backend.suspend()`` or ``backend.resume()`` under the watchdog; milliseconds taken."""
    started = time.perf_counter()
    with watched(what, seconds):
        getattr(backend, op)()
    return (time.perf_counter() - started) * 1e3
