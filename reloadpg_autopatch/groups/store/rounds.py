"""The store steps of destroy and reload, at O(1) store operations per rank.

Every training step pays one destroy and one reload on every rank, through the one store the
world shares. An exchange where every rank reads every rank's entry costs the store server N²
reads (37 s at 512 ranks measured here); here each rank appends its entry to one key, bumps one
counter and reads one key, and only the last rank to arrive (the one whose ``add`` returns the
world size) reads the N entries, once, in one value, to write that key. The server does O(N)
work in total, and a round leaves no per-rank key behind: the last arriver deletes the entries
and the counter once it has published the result, and the last arriver of the next round
deletes that result (``previous``), so the store does not grow with the cycles.

Torch-free on purpose: it needs only an object with ``set``/``add``/``append``/``wait``/
``compare_set``/``delete_key``/``check`` (every torch store: ``TCPStore``, ``FileStore``,
``HashStore``, ``PrefixStore``), so benchmarks drive it with threads.

Ranks may arrive up to ``timeout`` apart. A rank that never arrives, or a store that goes away
(the rank hosting it died), raises one ``PeerMissingError`` naming the step, the cycle and, for
a timeout, the ranks that never completed the round: the first rank to time out ends the round
for every rank, and each names those that did not say they are alive (``stalled``, on that
error path only).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ...errors import PeerMissingError
from . import entries, failures, stalled

logger = logging.getLogger("reloadpg_autopatch")

__all__ = ["RendezvousError", "agree", "done_key", "exchange", "sync"]

Payload = bytes | str
Timeout = timedelta | float

#: What a step that did not complete raises (a rank missing, or the store gone).
RendezvousError = PeerMissingError


def _timedelta(timeout: Timeout) -> timedelta:
    return timeout if isinstance(timeout, timedelta) else timedelta(seconds=float(timeout))


def _bytes(payload: Payload) -> bytes:
    return payload.encode() if isinstance(payload, str) else bytes(payload)


#: Characters of a round's token (``_fresh_token``).
TOKEN_CHARS = 16


def _fresh_token() -> bytes:
    return os.urandom(TOKEN_CHARS // 2).hex().encode()


def done_key(key: str) -> str:
    """The key a round under ``key`` publishes its result in (``previous`` of the next round)."""
    return f"{key}/done"


def _round(
    store: Any,
    key: str,
    rank: int,
    world_size: int,
    payload: bytes,
    *,
    combine: Callable[[list[bytes]], Payload] | None,
    timeout: Timeout,
    step: str,
    cycle: str | None,
    acknowledge: bool = False,
    previous: str | None = None,
    token: bool = False,
) -> bytes | None:
    """One round trip: publish, count in, the last arriver combines, everyone reads once.

    Per rank: an ``append`` and a ``set`` send and wait for no answer; the ``add``, the
    ``wait`` and the read are one round trip each. ``acknowledge``: every rank counts itself
    out too (one more round trip), and the last one deletes the result, for results as large
    as the entries (``exchange``); otherwise the result stays until the last arriver of the
    next round deletes it (``previous``: that round's result key, read by every rank by then).
    ``token``: the last arriver puts a fresh random token before the result, and every rank
    reads it (one more round trip for a sync): a name for what torch creates in this step
    that no earlier world on the same store used, whatever it left there.
    """
    wait_for = _timedelta(timeout)
    started = time.monotonic()
    arrived, count, done = f"{key}/arrived", f"{key}/count", done_key(key)
    stale = (previous,) if previous else ()
    counted = False
    try:
        # One key holds every entry: the last arriver reads them in one value, and deletes
        # one key, not N. The server applies one client's requests in order, so a rank's
        # entry is in before its count.
        store.append(arrived, entries.entry(rank, payload))
        last = store.add(count, 1) == world_size
        counted = True
        if last:
            fresh = _fresh_token() if token else b""
            if combine is None:
                store.set(done, fresh or b"1")
            else:
                found = entries.entries(entries.read(store, arrived))
                if len(found) != world_size or any(r not in found for r in range(world_size)):
                    raise RuntimeError(
                        f"{world_size} arrivals counted, entries from ranks {sorted(found)}"
                    )
                store.set(done, fresh + _bytes(combine([found[r] for r in range(world_size)])))
            # Every rank has counted in: nobody writes these again, nor reads the last result.
            entries.tidy(store, arrived, count, *stale)
        wakes = combine is not None or token  # its ranks read the result, so FAILED wakes them
        try:
            store.wait([done], wait_for)
        except Exception:
            if stalled.end(store, key, world_size, wakes=wakes) != stalled.COMPLETED:
                raise stalled.Stalled() from None
        if not wakes:
            return None
        result = entries.read(store, done)
        if result == stalled.FAILED:  # another rank timed out and ended the round
            raise stalled.Stalled()
        if acknowledge and store.add(f"{key}/read", 1) == world_size:
            entries.tidy(store, done, f"{key}/read")  # every rank has read it
        return result
    except stalled.Stalled as error:
        where = f"{step} ({failures.cycle_of(key, cycle)}, rank {rank} of {world_size})"
        try:
            failure = stalled.failure(
                store,
                key,
                rank,
                world_size,
                woken=wakes,
                where=where,
                step=step,
                timeout=wait_for,
                started=started,
            )
        except Exception as gone:  # the store went away meanwhile
            failure = failures.failure(
                store,
                gone,
                step=step,
                key=key,
                cycle=cycle,
                rank=rank,
                world_size=world_size,
                timeout=wait_for,
                started=started,
                arrived=True,
            )
        raise failure from error
    except Exception as error:
        raise failures.failure(
            store,
            error,
            step=step,
            key=key,
            cycle=cycle,
            rank=rank,
            world_size=world_size,
            timeout=wait_for,
            started=started,
            arrived=counted,
        ) from error


def sync(
    store: Any,
    key: str,
    rank: int,
    world_size: int,
    *,
    timeout: Timeout,
    step: str,
    cycle: str | None = None,
    previous: str | None = None,
    token: bool = False,
) -> str | None:
    """Wait until every rank reached ``key``: a barrier of 3 store operations per rank.

    An ``append`` (no answer awaited), an ``add`` and a ``wait``: two round trips. With
    ``token``, every rank also reads (4 operations) and returns the same fresh token.

    ``key`` must be new to this cycle (``process.current().key(...)``); ``step`` names the step
    in errors (``"reload: created sync"``), ``cycle`` too (by default read from ``key``);
    ``previous``: the result key of the round every rank passed before this one.
    """
    result = _round(
        store,
        key,
        rank,
        world_size,
        b"",
        combine=None,
        timeout=timeout,
        step=step,
        cycle=cycle,
        previous=previous,
        token=token,
    )
    return result.decode() if token and result is not None else None


def agree(
    store: Any,
    key: str,
    rank: int,
    world_size: int,
    payload: Payload,
    *,
    merge: Callable[[list[bytes]], Payload],
    timeout: Timeout,
    step: str,
    cycle: str | None = None,
    previous: str | None = None,
    token: bool = False,
) -> Any:
    """Every rank gets ``merge(every rank's payload, in rank order)``, the same bytes on each.

    With ``token``: ``(token, merged)``, the token fresh and the same on every rank.

    No rank returns before every rank has published, so what it learns is final. Per rank: 4
    store operations (3 round trips) and the payload and result in bytes; the last arriver
    adds one read of the N entries (one value), runs ``merge``, and deletes 2 keys (3 with
    ``previous``).
    """
    result = _round(
        store,
        key,
        rank,
        world_size,
        _bytes(payload),
        combine=merge,
        timeout=timeout,
        step=step,
        cycle=cycle,
        previous=previous,
        token=token,
    )
    assert result is not None
    if token:
        return result[:TOKEN_CHARS].decode(), result[TOKEN_CHARS:]
    return result


def exchange(
    store: Any,
    key: str,
    rank: int,
    world_size: int,
    payload: Payload,
    *,
    timeout: Timeout,
    step: str,
    cycle: str | None = None,
) -> list[bytes]:
    """Every member's ``payload`` in rank order (an all-gather through one store key).

    For handles every member needs all of (``ProcessGroup.reconfigure``): each member writes
    one entry and reads one key, instead of waiting on and reading every member's. The result
    is as large as the entries, so every member also counts itself out and the last one
    deletes it: 5 store operations per member, and nothing left in the store.
    """
    blob = _round(
        store,
        key,
        rank,
        world_size,
        _bytes(payload),
        combine=entries.pack,
        timeout=timeout,
        step=step,
        cycle=cycle,
        acknowledge=True,
    )
    assert blob is not None
    return entries.unpack(blob)
