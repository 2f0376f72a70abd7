"""What a survivor is told when a peer dies or never arrives at a creation of a cycle.

A group's rendezvous waits as long as the group's own timeout, and torch gives a group created
without one the backend's default (30 minutes for gloo), whatever WORLD's is. So a reload creates
every group with a timeout no longer than WORLD's (the group gets its own back afterwards), and a
creation that fails says which step of which cycle failed and which ranks were not there.

Finding those ranks costs nothing while all goes well: a rank whose creation failed marks that
in the store, then gives its peers a few seconds to fail too (they time out at about the same
moment, waiting for the same missing peer). The marks are the step's, not the group's: a member
stuck at another creation of the same step, behind the same missing peer, has marked itself
too. The members that marked nothing are the ones that died or never came.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from ..errors import PeerMissingError, ReloadPGError, format_ranks

logger = logging.getLogger("reloadpg_autopatch")

#: How long a failed rank waits for its peers' marks before naming the missing ones.
GRACE_S = 3.0


def _mark(key: str, rank: int) -> str:
    return f"{key}/failed/{rank}"


def _unmarked(store: Any, key: str, ranks: Sequence[int], me: int) -> list[int] | None:
    """The members that did not fail here in time; None when the store cannot say.

    The store may go away during the grace period: its host, a survivor too, may have named
    the missing ranks and exited first. What was read before that still stands.
    """
    missing: list[int] | None = None
    try:
        store.set(_mark(key, me), b"1")
        deadline = time.monotonic() + GRACE_S
        while True:
            missing = [r for r in ranks if r != me and not store.check([_mark(key, r)])]
            if not missing or time.monotonic() >= deadline:
                return missing
            time.sleep(0.2)
    except Exception:  # the store is gone: the rank hosting it died, or has exited
        return missing


def failure(
    step: str,
    cycle: str,
    *,
    store: Any,
    key: str,
    ranks: Sequence[int] | range,
    rank: int,
    timeout: timedelta,
    started: float,
    error: BaseException,
) -> ReloadPGError:
    """The error for a creation that failed: the step, the cycle, who was not there, and why.

    A ``PeerMissingError`` like a store step's when some member never came (``missing``) or
    the store is gone (``missing`` empty); a plain ``ReloadPGError`` when every member failed.
    """
    elapsed = time.monotonic() - started
    missing = _unmarked(store, key, ranks, rank)
    if missing is None:
        why = "the store is unreachable (the rank hosting it, usually rank 0, may have died)"
    elif missing:
        why = (
            f"ranks {format_ranks(missing)} did not arrive or died (this rank waited up to "
            f"{timeout.total_seconds():g} s, WORLD's timeout)"
        )
    else:
        why = "every member failed here, so the cause is above this step"
    message = (
        f"{step} ({cycle}) failed on rank {rank} after {elapsed:.1f} s: {why}; every rank must "
        f"reach it at the same point of its program. torch said: {type(error).__name__}: {error}"
    )
    logger.error("%s", message)
    if missing == []:
        return ReloadPGError(message)
    return PeerMissingError(message, missing or (), step)
