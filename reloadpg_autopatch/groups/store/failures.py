"""What a rank is told when a store round could not complete: a peer missing, or the store gone.

On the error path only: the happy path of a round (``rounds``) reads nothing of this. Torch-free,
as ``rounds`` is.
"""

from __future__ import annotations

import logging
import re
import time
from datetime import timedelta
from typing import Any

from ...errors import PeerMissingError, format_ranks
from . import entries

Timeout = timedelta | float

logger = logging.getLogger("reloadpg_autopatch")

#: ``process.ProcessState.key`` puts the cycle and the step's number first.
_CYCLE = re.compile(r"^reloadpg_autopatch/(\d+)/(\d+)/")


def cycle_of(key: str, cycle: str | None) -> str:
    if cycle is not None:
        return cycle
    found = _CYCLE.match(key)
    return f"cycle {found[1]}, step {found[2]}" if found else f"key {key!r}"


def failure(
    store: Any,
    error: BaseException,
    *,
    step: str,
    key: str,
    cycle: str | None,
    rank: int,
    world_size: int,
    timeout: timedelta,
    started: float,
    arrived: bool = False,
) -> PeerMissingError:
    """The error to raise when a store call failed during ``step``.

    ``arrived``: this rank had published and counted itself in; a store gone then left with its
    host after that, which is what the error says (no rank that arrived is blamed).
    """
    elapsed = time.monotonic() - started
    where = f"{step} ({cycle_of(key, cycle)}, rank {rank} of {world_size})"
    missing = entries.missing(store, f"{key}/arrived", f"{key}/done", world_size)
    if missing is None and arrived:
        message = (
            f"{where}: the store is unreachable after {elapsed:.1f} s: its host (rank 0, where "
            "torch's rendezvous puts it) left after this rank had arrived, before this rank "
            "read the step's outcome; no rank is known to be missing: the host's own error, in "
            f"its log, is the cause ({error})"
        )
        missing = []
    elif missing is None:
        message = (
            f"{where}: the store is unreachable after {elapsed:.1f} s (the rank hosting it, "
            f"usually rank 0, may have died): {error}"
        )
        missing = []
    elif missing:
        message = (
            f"{where}: {len(missing)} rank(s) did not arrive within {timeout.total_seconds():g} s "
            f"(waited {elapsed:.1f} s): ranks {format_ranks(missing)}; every rank must call it "
            "at the same point of its program"
        )
    else:
        message = f"{where}: the store failed after {elapsed:.1f} s: {error}"
    logger.error("%s", message)
    return PeerMissingError(message, missing, step)


def settle(
    store: Any, key: str, rank: int, world_size: int, *, timeout: Timeout, host: bool
) -> None:
    """On an agreed error only: every rank has read the result under ``key`` before the
    store's host leaves.

    A rank raising the error every rank agreed on may exit at once (an uncaught exception):
    if that rank hosts the store, a peer that had not yet read the result would find the
    store gone and learn nothing of the agreed error. So every rank counts itself as having
    read it (an ``add``; the last one also a ``set``), and the host waits for all of them,
    at most ``timeout``, then deletes the two keys. Never on the happy path, which keeps its
    store operations; a store that fails here only costs the wait, never the agreed error.
    """
    read, everyone = f"{key}/read", f"{key}/read by all"
    try:
        if store.add(read, 1) == world_size:
            store.set(everyone, b"1")
        if host:
            store.wait(
                [everyone],
                (timeout if isinstance(timeout, timedelta) else timedelta(seconds=float(timeout))),
            )
            entries.tidy(store, read, everyone)
    except Exception as error:
        logger.warning(
            "rank %d: not every rank confirmed reading the result of %r: %s", rank, key, error
        )
