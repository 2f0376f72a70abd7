"""The program lets one group go for good: ``torch.distributed.destroy_process_group(g)``."""

from __future__ import annotations

from typing import Any

from . import registry
from .record import State
from .unwrap import unwrap
from .ways.wrapper import ReloadableProcessGroup, binding


def release(group: Any) -> bool:
    """Destroy one of our groups for good (through the wrapper or its native handle).

    Reload will not revive it; one that sleeps suspended is released once the next reload
    has resumed it with its peers. Returns False when ``group`` is not one of ours, or one its
    way does not let go (WORLD's: destroying WORLD ends the world), so the caller hands it to
    torch.
    """
    if isinstance(group, ReloadableProcessGroup):
        record = group._record
    else:
        native = unwrap(group)
        record = registry.record_of(native) if native is not None else None
        if record is None:
            return False
    if not record.way.releasable(record):
        return False
    with registry.lock():
        if record.state is State.SUSPENDED:
            # Its communicator sleeps with its peers': they resume it together at the next
            # reload (a resume is collective), and then it goes here.
            record.release_pending = True
        elif record.state is State.BROKEN:
            binding.unserve(record, destroy=False)  # its communicator cannot be trusted
            record.move(State.RELEASED)
        elif record.state in (State.LIVE, State.DESTROYED):
            # In place, the object is torch's registered group even while destroyed.
            binding.unserve(record, destroy=record.state is State.LIVE or record.in_place)
            record.move(State.RELEASED)
    return True
