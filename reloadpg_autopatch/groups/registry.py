"""The records of this process, in creation order: adding, finding and pruning them.

torch creates groups collectively, in one order on every rank, so reload replays the recorded
creations in that order. Each record is the one in ``state.current().records``; this module is
the only place that adds or removes one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from . import state
from .record import Record, State


def lock() -> Any:
    """The lock every lifecycle step of this process holds."""
    return state.current().lock


def add(args: Sequence[Any], kwargs: dict[str, Any], name: str | None, initial: State) -> Record:
    """Record a creation at the end of the creation order."""
    record = Record(args, kwargs, name, initial)
    holder = state.current()
    with holder.lock:
        holder.records.append(record)
    return record


def records() -> list[Record]:
    """The records still of use, in creation order."""
    return state.current().records


def members() -> Iterator[Record]:
    """Records of groups this rank is a member of (whatever their state)."""
    return (r for r in state.current().records if r.member)


def record_of(native: Any) -> Record | None:
    """The record whose current native group is ``native``, if any."""
    for record in state.current().records:
        if record.native is native and record.member:
            return record
    return None


def prune() -> int:
    """Forget every ended record; returns how many."""
    holder = state.current()
    with holder.lock:
        before = len(holder.records)
        holder.records[:] = [r for r in holder.records if r.state is not State.ENDED]
        return before - len(holder.records)
