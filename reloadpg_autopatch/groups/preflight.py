"""Before a reload wakes anything: has this rank the memory for what it will allocate again?

A group that sleeps in place (suspend) allocates its communicator's buffers again when it
wakes; its way says how much (``Way.resume_need``: what ``memory_stats()`` called suspendable
before the suspend). The preflight sums the need per device and compares it, plus the memory
guard's margin (``SLIME_RELOADABLE_PG_MIN_FREE_GB``), with what the device has free; when
short, garbage is collected and the cache emptied, then the figures are read again. Where there
is no query for the device, there is nothing to compare and the rank counts as ready. Its
answer travels in the reload's agreement, so a rank short of memory makes every rank refuse
alike, before any resume.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterable
from typing import Any

from . import guard, memory
from .record import Record
from .store import channel

logger = logging.getLogger("reloadpg_autopatch")


def short(records: Iterable[Record]) -> list[str]:
    """Nothing if this rank has the memory to wake ``records``; else one line saying why."""
    needs: dict[str, list[Any]] = {}
    for record in records:
        for device, need in record.way.resume_need(record):
            entry = needs.setdefault(device.type, [0, []])
            entry[0] += need
            if str(record.name) not in entry[1]:
                entry[1].append(str(record.name))
    margin = int(guard.get_memory_guard().min_free_gb * memory.GiB)
    lines = []
    for kind, (need, groups) in needs.items():
        device = memory.current_device(kind)
        now = memory.figures(device)
        if now is None or now.free >= need + margin:
            continue
        gc.collect()
        try:
            memory.clear(device)
        except Exception as error:
            logger.warning("emptying the cache of %s failed: %s", device, error)
        now = memory.figures(device) or now
        if now.free < need + margin:
            lines.append(
                f"rank {channel.global_rank()} has {memory.human(now.free)} free on "
                f"{device} and needs {memory.human(need + margin)} ({memory.human(need)} to "
                f"resume groups {', '.join(map(repr, groups))} plus the {memory.human(margin)} "
                "margin of SLIME_RELOADABLE_PG_MIN_FREE_GB)"
            )
    return lines
