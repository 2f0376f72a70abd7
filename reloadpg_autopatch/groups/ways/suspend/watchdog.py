"""The watchdog: a suspend or a resume stuck inside NCCL never becomes a silent hang.

Both are collective inside NCCL with no timeout. The store rounds around them make every rank
arrive together, and a call stuck past the suspend timeout ends the process with its stacks,
as torch's NCCL watchdog does.
"""

from __future__ import annotations

import contextlib
import faulthandler
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


#: How long after the watchdog faulthandler's own thread ends the process if the watchdog
#: itself could not run (the call held the GIL).
BACKSTOP_S = 5.0


def suspend_timeout(world_timeout: timedelta) -> float:
    """Seconds one suspend or resume may take: ``SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT``, else
    WORLD's timeout. A bad value warns and keeps WORLD's."""
    raw = os.environ.get(_env.SUSPEND_TIMEOUT_ENV, "").strip()
    if raw:
        try:
            return _env.parse_seconds(raw, _env.SUSPEND_TIMEOUT_ENV)
        except ValueError as error:
            logger.warning("%s; using WORLD's timeout, %s", error, world_timeout)
    return world_timeout.total_seconds()


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
        faulthandler.dump_traceback(all_threads=True)
    os.kill(os.getpid(), signal.SIGABRT)


@contextlib.contextmanager
def watched(what: str, seconds: float) -> Iterator[None]:
    timer = threading.Timer(seconds, _expired, args=(what, seconds))
    timer.daemon = True
    timer.start()
    backstop = True
    try:
        faulthandler.dump_traceback_later(seconds + BACKSTOP_S, exit=True)
    except Exception:  # faulthandler unavailable (stderr closed): the timer alone
        backstop = False
    try:
        yield
    finally:
        timer.cancel()
        if backstop:
            faulthandler.cancel_dump_traceback_later()


def call(backend: Any, op: str, what: str, seconds: float) -> float:
    """``backend.suspend()`` or ``backend.resume()`` under the watchdog; milliseconds taken."""
    started = time.perf_counter()
    with watched(what, seconds):
        getattr(backend, op)()
    return (time.perf_counter() - started) * 1e3
