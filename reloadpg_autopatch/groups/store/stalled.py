"""A store round that timed out: one verdict, the ranks that never completed it named.

A round (``rounds``) completes when the last rank to count itself in publishes the result.
A rank that appended its entry and died before counting in (or froze there) leaves the round
incomplete with every entry present, so the entries cannot say who is missing; and ranks that
arrived up to WORLD's timeout apart time out as far apart, so what one sees at its timeout says
little of the others. So the first rank to time out ends the round for everyone, on the error
path only (the happy path keeps its store operations):

- it *poisons* the count (adds ``POISON``), so no rank arriving later can make it the world's
  size and publish a result the others never read; if every rank had counted in already, the
  round did complete and the result is read as usual;
- where the round's ranks read its result (an agreement, a sync with a token), it publishes
  ``FAILED`` as that result, which wakes every rank waiting for it at once;
- every rank on the error path appends itself to the round's ``alive`` key and waits
  ``GRACE_S``: a rank that never marks itself there by then never completed the round (it
  never came, died, or froze), and is named in ``missing``. So a round that ends so is raised
  ``GRACE_S`` after WORLD's timeout, every rank having had the whole timeout to arrive;
- each counts itself as judged, and the store's host (rank 0, where torch's rendezvous puts
  the server) waits for the others before it may exit, so its exit cannot take the verdict
  away from a peer still reading it.

Torch-free, as ``rounds`` is.
"""

from __future__ import annotations

import contextlib
import logging
import time
from datetime import timedelta
from typing import Any

from ...errors import PeerMissingError, format_ranks
from . import entries

logger = logging.getLogger("reloadpg_autopatch")

#: Added to a round's count by the rank that ends it: no later ``add`` returns the world's size.
POISON = 1 << 40
#: What an ended round publishes as its result: no round's real result is this value.
FAILED = b"\x00reloadpg_autopatch: round ended without every rank\x00"
#: How long a rank on the error path waits for the others to mark themselves alive.
GRACE_S = 2.0
#: How often the store's host reads how many ranks have judged, while it waits for them.
POLL_S = 0.1
#: The rank that hosts the store (torch's rendezvous puts the TCPStore server in rank 0).
HOST = 0

COMPLETED, ENDED = "completed", "ended"


class Stalled(Exception):
    """The round ended without every rank (internal: ``rounds`` turns it into the error)."""


def end(store: Any, key: str, world_size: int, *, wakes: bool) -> str:
    """This rank's wait for the round's result timed out: ``COMPLETED`` if every rank had
    counted in (the result is there, or about to be), else ``ENDED`` (poisoned, and with
    ``wakes`` its ``FAILED`` result published). Raises where the store itself fails."""
    count, done = f"{key}/count", f"{key}/done"
    counted = store.add(count, POISON) % POISON
    if counted == world_size:  # the last arriver counted in before this: it publishes now
        with contextlib.suppress(Exception):  # else it died between counting and publishing
            store.wait([done], timedelta(seconds=GRACE_S))
            return COMPLETED
    published = (
        bytes(store.compare_set(done, b"", FAILED)) != FAILED if wakes else store.check([done])
    )
    if published:  # just now, its count already deleted: this rank's add made it again
        with contextlib.suppress(Exception):  # one stray key costs nothing
            store.delete_key(count)
        return COMPLETED
    return ENDED


def verdict(
    store: Any, key: str, rank: int, world_size: int, *, woken: bool
) -> tuple[list[int], list[int]]:
    """``(missing, silent)`` for an ended round, after ``GRACE_S``: the ranks that never
    completed it, and among them those that arrived (their entry is there) but never counted
    in or never marked themselves alive.

    Where the round's ranks were woken (``woken``), every live rank marks itself within the
    grace, so the missing are the unmarked. Where they were not (a sync that reads nothing),
    a live rank marks itself only at its own timeout: the missing are those with no entry,
    and, where some rank appended without counting in, the unmarked among those with one.
    """
    alive, arrived = f"{key}/alive", f"{key}/arrived"
    store.append(alive, entries.entry(rank, b""))
    time.sleep(GRACE_S)  # one read after it, not a poll: O(1) store operations per rank
    marked = entries.entries(entries.read(store, alive))
    came = entries.entries(entries.read(store, arrived)) if store.check([arrived]) else {}
    if woken:
        missing = [r for r in range(world_size) if r not in marked]
    else:
        counted = store.add(f"{key}/count", 0) % POISON
        missing = [r for r in range(world_size) if r not in came]
        if counted < len(came):
            missing = sorted({*missing, *(r for r in came if r not in marked)})
    silent = [r for r in missing if r in came]
    _judged(store, key, rank, len(marked))
    return missing, silent


def _judged(store: Any, key: str, rank: int, live: int) -> None:
    """Count this rank as judged; the store's host waits until every live rank is, so that
    its exit cannot take the verdict from one still reading it (bounded by ``GRACE_S``)."""
    judged = f"{key}/judged"
    count = store.add(judged, 1)
    if rank != HOST:
        return
    deadline = time.monotonic() + GRACE_S
    while count < live and time.monotonic() < deadline:
        time.sleep(POLL_S)
        count = store.add(judged, 0)


def failure(
    store: Any,
    key: str,
    rank: int,
    world_size: int,
    *,
    woken: bool,
    where: str,
    step: str,
    timeout: timedelta,
    started: float,
) -> PeerMissingError:
    """The error every rank raises for a round that ended without every rank (``verdict``);
    raises where the store itself fails meanwhile."""
    missing, silent = verdict(store, key, rank, world_size, woken=woken)
    elapsed = time.monotonic() - started
    if missing:
        after = (
            f" (ranks {format_ranks(silent)} arrived, then died or froze before completing it)"
            if silent
            else ""
        )
        message = (
            f"{where}: {len(missing)} rank(s) did not complete it within "
            f"{timeout.total_seconds():g} s (waited {elapsed:.1f} s): ranks "
            f"{format_ranks(missing)}{after}; every rank must call it at the same point of its "
            "program"
        )
    else:
        message = (
            f"{where}: it did not complete within {timeout.total_seconds():g} s though every "
            f"rank is alive (waited {elapsed:.1f} s): a rank arrived after another had given up"
        )
    logger.error("%s", message)
    return PeerMissingError(message, missing, step)
