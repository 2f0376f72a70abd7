"""What WORLD's room knows about itself, for the doctor: WORLD as the program holds it, its
native group, the backends it names, and the groups every cycle leaves alone."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from .. import participants
from ..backends import component_names
from . import carry


def held() -> list[Any]:
    """WORLD as the program holds it (its stand-in while it sleeps), or none before
    ``init_process_group``."""
    return [dist.GroupMember.WORLD] if dist.is_initialized() else []


def native() -> Any:
    """WORLD's native group, also behind its stand-in while it sleeps (its record keeps it);
    None before ``init_process_group``."""
    world = dist.GroupMember.WORLD if dist.is_initialized() else None
    inner = getattr(world, "group", None) or getattr(
        getattr(world, "_record", None), "native", None
    )
    return inner if inner is not None else world


def bound_device() -> Any:
    """The device WORLD was bound to (``init_process_group(device_id=...)``), or None."""
    world = dist.GroupMember.WORLD if dist.is_initialized() else None
    return getattr(world, "bound_device_id", None)


def backend_names() -> tuple[str, ...]:
    """The backends WORLD's backend string names (``"cpu:gloo,cuda:nccl"`` names two); none
    where torch no longer knows WORLD."""
    if not dist.is_initialized():
        return ()
    try:
        return tuple(component_names(dist.get_backend()))
    except Exception:  # torch no longer knows WORLD
        return ()


def left_alone() -> tuple[list[dict[str, Any]], list[str]]:
    """In a live process: the groups torch knows that this package did not make reloadable,
    which every cycle, WORLD's swap included, leaves as they are; and a problem where this
    torch would reach one through the swap anyway (the next destroy would refuse)."""
    if not dist.is_initialized():
        return [], []
    groups = carry.left_alone()
    found = [{"name": carry.name(g), **carry.describe(g)} for g in groups]
    registered = participants.registration()
    if registered is None or not registered.swap:
        return found, []
    return found, [
        f"the next destroy_process_groups() will refuse: {line}" for line in carry.obstacles(groups)
    ]
