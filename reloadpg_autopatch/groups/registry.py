"""The records of this process, in creation order: adding, finding and pruning them.

torch creates groups collectively, in one order on every rank, so reload replays the recorded
creations in that order. Each record is one in ``process.current().records``; this module is
the only place that adds or removes one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from . import process
from .record import Record, State


def lock() -> Any:
    """The lock every lifecycle step of this process takes for its bookkeeping."""
    return process.current().lock


def add(args: Sequence[Any], kwargs: dict[str, Any], name: str | None, initial: State) -> Record:
    """Record a creation at the end of the creation order."""
    record = Record(args, kwargs, name, initial)
    holder = process.current()
    with holder.lock:
        holder.records.append(record)
        holder.changes += 1
    return record


def records() -> list[Record]:
    """The records still of use, in creation order."""
    return process.current().records


def members() -> Iterator[Record]:
    """Records of groups this rank is a member of (whatever their state)."""
    return (r for r in process.current().records if r.member)


def record_of(native: Any) -> Record | None:
    """The record whose current native group is ``native``, if any.

    Destroying groups one at a time through their native handles calls this once per group:
    a scan each would cost records x records, so hits come from an index (ids only: it holds
    no native group alive). A hit is checked against the record itself, so an entry whose
    native changed since is never believed.
    """
    holder = process.current()
    if holder.index_at == holder.changes:
        record = holder.index.get(id(native))
        if record is not None and record.native is native and record.member:
            return record
    # Stale or absent (a reload gave the records new natives): rebuild it, the first record
    # holding a native winning as in a scan.
    index: dict[int, Record] = {}
    for record in holder.records:
        if record.native is not None and record.member:
            index.setdefault(id(record.native), record)
    holder.index, holder.index_at = index, holder.changes
    found = index.get(id(native))
    return found if found is not None and found.native is native else None


def prune() -> int:
    """Forget every ended record; returns how many."""
    holder = process.current()
    with holder.lock:
        holder.index, holder.index_at = {}, -1  # it may hold ended records: let them go
        before = len(holder.records)
        holder.records[:] = [r for r in holder.records if r.state is not State.ENDED]
        holder.changes += 1
        return before - len(holder.records)
