"""The records of this process, in creation order: adding, finding and pruning them.

torch creates groups collectively, in one order on every rank, so reload replays the recorded
creations in that order. Each record is one in ``process.current().records``, the part of the
holder this module alone writes. WORLD's record, when WORLD is registered, comes first.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from . import process
from .record import Record, State


def lock() -> Any:
    """The lock every lifecycle step of this process takes for its bookkeeping."""
    return process.current().lock


def add(
    args: Sequence[Any],
    kwargs: dict[str, Any],
    name: str | None,
    initial: State,
    way: Any,
    *,
    first: bool = False,
) -> Record:
    """Record a creation at the end of the creation order (``first``: before every other)."""
    record = Record(args, kwargs, name, initial, way)
    held = process.current().records
    with process.current().lock:
        if first:
            held.all.insert(0, record)
        else:
            held.all.append(record)
        held.changes += 1
    return record


def belong_to(default: Any, *, again: bool = False) -> None:
    """The records belong to ``default``'s world (kept if they belong to one, unless ``again``:
    WORLD was swapped, or a new world starts with ``None``)."""
    held = process.current().records
    if again or held.world is None:
        held.world = default


def world() -> Any:
    """The default group the records belong to (None: no group made in this world yet)."""
    return process.current().records.world


def records() -> list[Record]:
    """The records still of use, in creation order."""
    return process.current().records.all


def members() -> Iterator[Record]:
    """Records of groups this rank is a member of (whatever their state)."""
    return (r for r in process.current().records.all if r.member)


def record_of(native: Any) -> Record | None:
    """The record whose current native group is ``native``, if any.

    Destroying groups one at a time through their native handles calls this once per group:
    a scan each would cost records x records, so hits come from an index (ids only: it holds
    no native group alive). A hit is checked against the record itself, so an entry whose
    native changed since is never believed.
    """
    held = process.current().records
    if held.index_at == held.changes:
        record = held.index.get(id(native))
        if record is not None and record.native is native and record.member:
            return record
    # Stale or absent (a reload gave the records new natives): rebuild it, the first record
    # holding a native winning as in a scan.
    index: dict[int, Record] = {}
    for record in held.all:
        if record.native is not None and record.member:
            index.setdefault(id(record.native), record)
    held.index, held.index_at = index, held.changes
    found = index.get(id(native))
    return found if found is not None and found.native is native else None


def prune() -> int:
    """Forget every ended record; returns how many."""
    holder = process.current()
    held = holder.records
    with holder.lock:
        held.index, held.index_at = {}, -1  # it may hold ended records: let them go
        before = len(held.all)
        held.all[:] = [r for r in held.all if r.state is not State.ENDED]
        held.changes += 1
        return before - len(held.all)
