"""Serve a record's wrapper with a native group, or take it away: the one place that does.

While a native group serves a reloadable one, the wrapper points at it, torch's ``_world`` maps
hold the wrapper's aliases of its entries, and a name that was handed out resolves to the
wrapper. Taking the native group away undoes all three (after deregistering the memory pools
kept on the record, when the native group is also destroyed).
"""

from __future__ import annotations

from typing import Any

from ... import aliases, frees, names, pools
from ...record import Record, State


def serve(record: Record, native: Any) -> None:
    """``native`` now serves the record's group: the wrapper and torch's maps point at it."""
    record.set_native(native)
    wrapper = record.wrapper
    if wrapper is not None:
        wrapper.mirror_backends()
        record.alias = aliases.link(wrapper, native)
        if record.published is not None:  # its name was handed out: it resolves to the wrapper
            names.publish(record.name, wrapper)


def unserve(record: Record, destroy: bool) -> None:
    """Take the record's native group away (destroying it first when ``destroy``)."""
    aliases.unlink(record.alias)
    record.alias = None
    try:
        if destroy and record.native is not None:
            if record.replays:
                pools.release(record, f"group {record.name!r}")
            frees.destroy(record.native, frees.label(record.name, record.kwargs))
    finally:
        record.set_native(None)


def abandoned(record: Record) -> bool:
    """Whether the program dropped the record's wrapper (torch's maps hold its own groups)."""
    return (
        not record.way.torch_object
        and record.member
        and record.wrapper is None
        and record.state in (State.LIVE, State.DESTROYED)
    )


def drop_if_abandoned(record: Record) -> None:
    """A member record whose wrapper the program dropped is released."""
    if abandoned(record):
        unserve(record, destroy=record.state is State.LIVE)
        record.move(State.RELEASED)
