"""The watchdog: a suspend or a resume stuck inside NCCL never becomes a silent hang.

Both are collective inside NCCL with no timeout. The store rounds around them make every rank
arrive together, and a call stuck past the suspend timeout ends the process with its stacks,
as torch's NCCL watchdog does.

Nothing the program may own is taken: not faulthandler's one timer per process (a training
program's own hang detector, ``faulthandler.dump_traceback_later``, which no one can read back
to restore), not a signal handler, not ``SIGALRM``'s interval timer, not ``sys.excepthook``.
The watchdog is a thread of its own (``threading.Timer``), and its backstop, for a call that
holds the GIL so that no Python thread can run, is a POSIX per-process timer of its own
(``timer_create``: a process may hold any number, each independent), created for the one call
and deleted when it returns or raises.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import faulthandler
import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from .... import _env

logger = logging.getLogger("reloadpg_autopatch")


#: How long after the watchdog the backstop ends the process, should the watchdog itself not
#: run (the call holds the GIL).
BACKSTOP_S = 5.0
#: The longest timeout the watchdog times: the longest accepted (about 31 years), or less where
#: a thread cannot wait that long (``threading.TIMEOUT_MAX``, less the backstop's margin).
LONGEST_S = float(min(_env.LONGEST_SUSPEND_TIMEOUT_S, int(threading.TIMEOUT_MAX - BACKSTOP_S)))


def suspend_timeout(world_timeout: timedelta) -> float:
    """Seconds one suspend or resume may take: ``SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT``, else
    WORLD's timeout (at most ``LONGEST_S``). A bad value is reported once per process, and
    WORLD's timeout is used."""
    raw = os.environ.get(_env.SUSPEND_TIMEOUT_ENV)
    if raw is not None and raw.strip():
        try:
            return min(_env.parse_suspend_timeout(raw), LONGEST_S)
        except ValueError as error:
            if _env.first_report(_env.SUSPEND_TIMEOUT_ENV, raw):
                logger.warning("%s; using WORLD's timeout instead", error)
    return min(world_timeout.total_seconds(), LONGEST_S)


def _expired(what: str, seconds: float) -> None:
    """The watchdog: a suspend or resume stuck in NCCL never becomes a silent hang."""
    message = (
        f"reloadpg_autopatch: {what} did not return within {seconds:g} s "
        f"({_env.SUSPEND_TIMEOUT_ENV}, or WORLD's timeout). Every rank had passed the step's "
        "store sync, so a peer failed or hangs inside NCCL's barrier; NCCL cannot time it "
        "out, so this process ends here (as torch's NCCL watchdog does). Stacks follow."
    )
    logger.critical("%s", message)
    with contextlib.suppress(Exception):
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        faulthandler.dump_traceback(all_threads=True)  # a one-time dump: no timer is touched
    # abort() ends the process with SIGABRT even if the program handles SIGABRT in Python
    # (its handler would only run once the stuck call returned).
    os.abort()


# ---- the backstop: a POSIX timer of our own --------------------------------------------------

_CLOCK_MONOTONIC = 1
_SIGEV_SIGNAL = 0


class _Sigevent(ctypes.Structure):
    """Linux's ``struct sigevent`` (64 bytes): the value, the signal, how to notify, padding."""

    _fields_ = [
        ("value", ctypes.c_void_p),
        ("signo", ctypes.c_int),
        ("notify", ctypes.c_int),
        ("pad", ctypes.c_int * ((64 - ctypes.sizeof(ctypes.c_void_p) - 8) // 4)),
    ]


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("interval", _Timespec), ("value", _Timespec)]


@functools.cache
def _timers() -> Any:
    """libc's ``timer_create`` family, or None where there is none (not Linux, 32-bit)."""
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_long) != 8:
        return None
    for name in (None, ctypes.util.find_library("rt")):
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            create, settime, delete = lib.timer_create, lib.timer_settime, lib.timer_delete
        except (OSError, AttributeError):
            continue
        create.argtypes = [ctypes.c_int, ctypes.POINTER(_Sigevent), ctypes.POINTER(ctypes.c_void_p)]
        settime.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.POINTER(_Itimerspec),
            ctypes.c_void_p,
        ]
        delete.argtypes = [ctypes.c_void_p]
        create.restype = settime.restype = delete.restype = ctypes.c_int
        return lib
    logger.debug("no POSIX timers here: the watchdog has no backstop for a call holding the GIL")
    return None


def _backstop_signal() -> int:
    """SIGABRT (the program's faulthandler, if enabled, dumps the stacks), unless the program
    handles or ignores it in Python: a Python handler cannot run while the GIL is held, so
    then SIGKILL, which nothing can stop."""
    handler = signal.getsignal(signal.SIGABRT)
    if handler is signal.SIG_DFL or handler is None:
        return int(signal.SIGABRT)
    return int(signal.SIGKILL)


def _arm_backstop(seconds: float) -> ctypes.c_void_p | None:
    """A one-shot POSIX timer that signals this process after ``seconds``; None if none."""
    lib = _timers()
    if lib is None:
        return None
    event = _Sigevent()
    event.notify = _SIGEV_SIGNAL
    event.signo = _backstop_signal()
    timer = ctypes.c_void_p()
    if lib.timer_create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) != 0:
        logger.debug("timer_create failed (errno %d): no backstop", ctypes.get_errno())
        return None
    spec = _Itimerspec()
    spec.value.sec = int(seconds)
    spec.value.nsec = int((seconds - int(seconds)) * 1e9)
    if lib.timer_settime(timer, 0, ctypes.byref(spec), None) != 0:
        lib.timer_delete(timer)
        logger.debug("timer_settime failed (errno %d): no backstop", ctypes.get_errno())
        return None
    return timer


def _disarm_backstop(timer: ctypes.c_void_p | None) -> None:
    if timer is not None:
        _timers().timer_delete(timer)


@contextlib.contextmanager
def watched(what: str, seconds: float) -> Iterator[None]:
    """End the process if the block runs longer than ``seconds`` (``what`` names it); a block
    that returns or raises leaves nothing armed."""
    seconds = min(seconds, LONGEST_S)
    timer = threading.Timer(seconds, _expired, args=(what, seconds))
    timer.daemon = True
    timer.start()
    backstop = _arm_backstop(seconds + BACKSTOP_S)
    try:
        yield
    finally:
        timer.cancel()
        _disarm_backstop(backstop)


def call(backend: Any, op: str, what: str, seconds: float) -> float:
    """``backend.suspend()`` or ``backend.resume()`` under the watchdog; milliseconds taken."""
    started = time.perf_counter()
    with watched(what, seconds):
        getattr(backend, op)()
    return (time.perf_counter() - started) * 1e3
