"""The store steps of destroy and reload, at O(1) store operations per rank.

Every training step pays one destroy and one reload on every rank, through the one store the
world shares. An exchange where every rank reads every rank's entry costs the store server N²
reads (37 s at 512 ranks measured here); here each rank writes its entry, bumps one counter and
reads one key, and only the last rank to arrive (the one whose ``add`` returns the world size)
reads the N entries, once, to write that key. The server does O(N) work in total.

Torch-free on purpose: it needs only an object with ``set``/``get``/``add``/``wait``/
``multi_get``/``check`` (a ``TCPStore``, a ``PrefixStore``), so benchmarks drive it with threads.

Ranks may arrive up to ``timeout`` apart. A rank that never arrives, or a store that goes away
(the rank hosting it died), raises one ``RuntimeError`` naming the step, the cycle and, for a
timeout, the ranks missing; only that error path looks at each rank's arrival key.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

logger = logging.getLogger("reloadpg_autopatch")

__all__ = [
    "RendezvousError",
    "agree",
    "exchange",
    "expand_name_sets",
    "merge_name_sets",
    "sync",
]

Payload = bytes | str
Timeout = timedelta | float

#: ``state.ProcessState.key`` puts the world epoch and the generation first.
_CYCLE = re.compile(r"^reloadpg_autopatch/(\d+)/(\d+)/")


class RendezvousError(RuntimeError):
    """A rendezvous step did not complete: a rank missing, or the store gone."""

    def __init__(self, message: str, missing: Sequence[int] = ()) -> None:
        super().__init__(message)
        #: Ranks whose arrival key was absent when the step gave up (empty: unknown).
        self.missing = list(missing)


def _timedelta(timeout: Timeout) -> timedelta:
    return timeout if isinstance(timeout, timedelta) else timedelta(seconds=float(timeout))


def _cycle_of(key: str, cycle: str | None) -> str:
    if cycle is not None:
        return cycle
    found = _CYCLE.match(key)
    return f"world {found[1]}, cycle {found[2]}" if found else f"key {key!r}"


def _bytes(payload: Payload) -> bytes:
    return payload.encode() if isinstance(payload, str) else bytes(payload)


def _missing(store: Any, arrival: Callable[[int], str], world_size: int) -> list[int] | None:
    """The ranks whose arrival key is absent; None when the store cannot say (it is gone)."""
    try:
        return [rank for rank in range(world_size) if not store.check([arrival(rank)])]
    except Exception:  # the store itself failed: the caller says so
        return None


def _failure(
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
    arrival: Callable[[int], str],
) -> RendezvousError:
    """The error to raise when a store call failed during ``step``."""
    elapsed = time.monotonic() - started
    where = f"{step} ({_cycle_of(key, cycle)}, rank {rank} of {world_size})"
    missing = _missing(store, arrival, world_size)
    if missing is None:
        message = (
            f"{where}: the store is unreachable after {elapsed:.1f} s (the rank hosting it, "
            f"usually rank 0, may have died): {error}"
        )
        missing = []
    elif missing:
        shown = ", ".join(str(r) for r in missing[:32]) + (" ..." if len(missing) > 32 else "")
        message = (
            f"{where}: {len(missing)} rank(s) did not arrive within {timeout.total_seconds():g} s "
            f"(waited {elapsed:.1f} s): ranks {shown}; every rank must call it at the same "
            "point of its program"
        )
    else:
        message = f"{where}: the store failed after {elapsed:.1f} s: {error}"
    logger.error("%s", message)
    return RendezvousError(message, missing)


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
) -> bytes | None:
    """One round trip: publish, count in, the last arriver combines, everyone reads once."""
    wait_for = _timedelta(timeout)
    started = time.monotonic()

    def arrival(r: int) -> str:
        return f"{key}/arrived/{r}"

    done = f"{key}/done"
    try:
        store.set(arrival(rank), payload)
        if store.add(f"{key}/count", 1) == world_size:
            if combine is None:
                store.set(done, b"1")
            else:
                entries = store.multi_get([arrival(r) for r in range(world_size)])
                store.set(done, _bytes(combine([bytes(e) for e in entries])))
        store.wait([done], wait_for)
        return bytes(store.get(done)) if combine is not None else None
    except Exception as error:
        raise _failure(
            store,
            error,
            step=step,
            key=key,
            cycle=cycle,
            rank=rank,
            world_size=world_size,
            timeout=wait_for,
            started=started,
            arrival=arrival,
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
) -> None:
    """Wait until every rank reached ``key``: a barrier of 3 store operations per rank.

    ``key`` must be new to this cycle (``state.current().key(...)``); ``step`` names the step
    in errors (``"reload: created"``), ``cycle`` too (by default read from ``key``).
    """
    _round(
        store, key, rank, world_size, b"1", combine=None, timeout=timeout, step=step, cycle=cycle
    )


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
) -> bytes:
    """Every rank gets ``merge(every rank's payload, in rank order)``, the same bytes on each.

    No rank returns before every rank has published, so what it learns is final. Per rank: 4
    store operations and the payload and result in bytes; the last arriver adds one
    ``multi_get`` of the N entries and runs ``merge``.
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
    )
    assert result is not None
    return result


def _pack(entries: list[bytes]) -> bytes:
    """Length-prefixed concatenation (handles are opaque bytes: no separator is safe)."""
    return b"".join(len(e).to_bytes(8, "big") + e for e in entries)


def _unpack(blob: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(blob):
        size = int.from_bytes(blob[at : at + 8], "big")
        out.append(blob[at + 8 : at + 8 + size])
        at += 8 + size
    return out


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
    one key and reads one key, instead of waiting on and reading every member's.
    """
    blob = agree(
        store, key, rank, world_size, payload, merge=_pack, timeout=timeout, step=step, cycle=cycle
    )
    return _unpack(blob)


# ---- merging entries that list group names ---------------------------------------------


def _runs(names: set[str]) -> dict[str, list[Any]]:
    """``names`` with decimal ones (torch's group names are a counter) packed into runs."""
    numbers = sorted(int(n) for n in names if n.isascii() and n.isdigit() and str(int(n)) == n)
    runs: list[list[int]] = []
    for number in numbers:
        if runs and runs[-1][1] == number - 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    packed = {str(n) for n in numbers}
    return {"runs": runs, "names": sorted(names - packed)}


def _names(packed: dict[str, list[Any]]) -> list[str]:
    out = [str(n) for first, last in packed["runs"] for n in range(first, last + 1)]
    return out + list(packed["names"])


def merge_name_sets(entries: list[bytes]) -> bytes:
    """Merge JSON objects field by field: a list becomes the union, a boolean the ``any``.

    The union of every rank's group names is every group of the world: thousands at scale,
    read by every rank. torch names groups with a counter, so the union is sent as runs of
    numbers (``[[0, 17999]]``): the result every rank reads stays small as N grows.
    """
    sets: dict[str, set[str]] = {}
    flags: dict[str, bool] = {}
    for entry in entries:
        for field, value in json.loads(entry).items():
            if isinstance(value, bool):
                flags[field] = flags.get(field, False) or value
            else:
                sets.setdefault(field, set()).update(value)
    merged: dict[str, Any] = {field: _runs(names) for field, names in sets.items()}
    return json.dumps(merged | flags, separators=(",", ":")).encode()


def expand_name_sets(merged: bytes) -> dict[str, Any]:
    """The object ``merge_name_sets`` packed: lists of names and booleans again."""
    return {
        field: value if isinstance(value, bool) else _names(value)
        for field, value in json.loads(merged).items()
    }
