"""A new group made from a sleeping group's communicator: refused before torch reaches it.

NCCL makes a group's communicator by splitting its parent's (``ncclCommSplit``, and
``ncclCommShrink`` for ``shrink_group``). torch 2.15's default ``nccl`` (nccl2) does it at
``new_group`` time, from WORLD's communicator, which it binds to a device even without
``device_id``; ``split_group`` and ``shrink_group`` do it on every torch, from the parent they
are given; and the classic backend splits at the new group's first collective. A split is a
backend call that no pre-hook sees, so nothing guards it while the parent sleeps: NCCL would
run on a suspended communicator. So a creation whose communicator would come from a sleeping
one is refused here, on every torch and every rank alike (each rank sees the same parent
asleep), before torch is called: ``GroupSuspendedError`` naming the parent and
``reload_process_groups()``.

A group on other backends is allowed: on the devices where the parent sleeps, it uses neither
the parent's backend nor one that serves no CPU device (``backends``: ``gloo`` groups, which
hold no accelerator memory, are created while asleep as before).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ...errors import GroupSuspendedError
from .. import process, registry
from ..backends import serves_only_accelerators
from ..record import Record, State


def _record(group: Any) -> Record | None:
    """The record of ``group``: torch's own, or a wrapper (it carries its record)."""
    record = getattr(group, "_record", None)
    if record is not None:
        return record
    return registry.record_of(group)


def sleeping_devices(record: Record | None) -> set[str]:
    """The device types whose communicators of ``record``'s group are suspended now."""
    if record is None or record.state is not State.SUSPENDED or record.sleep is None:
        return set()
    return {str(getattr(device, "type", device)) for device, _backend in record.sleep.legs}


def _device_map(backend: Any) -> dict[str, str] | None:
    """``{device type: backend name}`` of a backend string, as torch reads it (None: torch
    would refuse the string itself, and says why better than we can)."""
    try:
        config = c10d.BackendConfig(dist.Backend(str(backend)))
        return {str(d): str(b).lower() for d, b in config.get_device_backend_map().items()}
    except Exception:
        return None


def _parent_map(record: Record) -> dict[str, str]:
    text = c10d._world.pg_backend_config.get(record.native, "") if record.native else ""
    pairs = (part.split(":", 1) for part in str(text).split(",") if ":" in part)
    return {device.strip(): name.strip().lower() for device, name in pairs}


def refuse_new_group(backend: Any = None) -> None:
    """Raise ``GroupSuspendedError`` if ``new_group(backend=backend)`` would split WORLD's
    communicator while it sleeps (``backend`` None: WORLD's own, as torch takes it)."""
    _refuse("new_group()", None, lambda record, asleep: _would_split(record, asleep, backend))


def refuse_split(call: str, parent: Any = None) -> None:
    """Raise ``GroupSuspendedError`` if ``call`` (``split_group``, ``shrink_group``) works on
    ``parent`` (None: WORLD) while any of its communicators sleeps (a ``split_group`` that
    keeps only an awake CPU leg is refused too: it waits for the reload like the rest)."""
    _refuse(call, parent, lambda record, asleep: asleep)


def _refuse(call: str, parent: Any, narrow: Callable[[Record, set[str]], set[str]]) -> None:
    holder = process.current()
    if not holder.records.all:
        return  # nothing recorded, so nothing sleeps: the common case costs nothing
    with holder.lock:
        chosen = c10d._world.default_pg if parent is None else parent
        record = _record(chosen) if chosen is not None else None
        asleep = sleeping_devices(record)
        if record is None or not asleep:
            return
        asleep = narrow(record, asleep)
        if not asleep:
            return
        label = record.way.label(record)
    raise GroupSuspendedError(
        f"{call} would make a communicator from the one of {label}, which is suspended "
        f"({', '.join(sorted(asleep))}): torch makes a new group's NCCL communicator by "
        "splitting its parent's (torch 2.15's nccl2 at creation, from WORLD's), a backend "
        "call no guard sees, and reloadpg_autopatch.destroy_process_groups() released that "
        "communicator's memory. Call reloadpg_autopatch.reload_process_groups() on every rank "
        "first, or create the group before destroy_process_groups(); a group on a CPU backend "
        "(backend='gloo') may be created while asleep"
    )


def _would_split(record: Record, asleep: set[str], backend: Any) -> set[str]:
    """The sleeping device types a new group of ``backend`` would split from: there it uses
    the parent's backend, or one that holds accelerator memory (torch may split any NCCL
    flavour from the parent's: 2.15 picks the split source by device, not by backend)."""
    if backend is None:  # torch's new_group takes WORLD's backend string
        entry = c10d._world.pg_map.get(record.native) if record.native is not None else None
        backend = entry[0] if entry else None
    wanted = _device_map(backend) if backend is not None else None
    if wanted is None:
        return set()
    parent = _parent_map(record)
    return {
        device
        for device in asleep
        if device in wanted
        and (wanted[device] == parent.get(device) or serves_only_accelerators(wanted[device]))
    }
