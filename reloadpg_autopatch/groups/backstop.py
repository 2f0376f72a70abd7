"""The watchdog's backstop: a POSIX timer of its own, for a call that holds the GIL.

When a stuck call holds the GIL, no Python thread can run, the watchdog's own included; this
timer (``timer_create``: a process may hold any number, each independent) then signals the
process itself. One per process, created on first use and re-armed after that; made again when
the signal it must send changes (the program began to handle SIGABRT). A forked child makes its
own (a parent's timer is not inherited).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import signal
import sys
from typing import Any

logger = logging.getLogger("reloadpg_autopatch")


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


def backstop_signal() -> int:
    """SIGABRT (the program's faulthandler, if enabled, dumps the stacks), unless the program
    handles or ignores it in Python: a Python handler cannot run while the GIL is held, so
    then SIGKILL, which nothing can stop."""
    handler = signal.getsignal(signal.SIGABRT)
    if handler is signal.SIG_DFL or handler is None:
        return int(signal.SIGABRT)
    return int(signal.SIGKILL)


class Backstop:
    """One POSIX timer of this process, created on first use and re-armed after that; made
    again when the signal it must send changes (the program began to handle SIGABRT)."""

    def __init__(self) -> None:
        self.timer: ctypes.c_void_p | None = None
        self.signo = 0
        self.armed = False

    def _create(self, signo: int) -> bool:
        lib = _timers()
        if lib is None:
            return False
        if self.timer is not None:
            lib.timer_delete(self.timer)
            self.timer = None
        event = _Sigevent()
        event.notify = _SIGEV_SIGNAL
        event.signo = signo
        timer = ctypes.c_void_p()
        if lib.timer_create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) != 0:
            logger.debug("timer_create failed (errno %d): no backstop", ctypes.get_errno())
            return False
        self.timer, self.signo = timer, signo
        return True

    def _set(self, seconds: float) -> None:
        spec = _Itimerspec()
        spec.value.sec = int(seconds)
        spec.value.nsec = int((seconds - int(seconds)) * 1e9)
        if _timers().timer_settime(self.timer, 0, ctypes.byref(spec), None) != 0:
            logger.debug("timer_settime failed (errno %d): no backstop", ctypes.get_errno())

    def arm(self, seconds: float) -> None:
        """Signal this process ``seconds`` from now (replacing any earlier arming)."""
        signo = backstop_signal()
        if (self.timer is None or signo != self.signo) and not self._create(signo):
            return
        self._set(max(seconds, 1e-3))
        self.armed = True

    def disarm(self) -> None:
        if self.armed and self.timer is not None:
            self._set(0.0)  # a zero value disarms a POSIX timer
        self.armed = False
