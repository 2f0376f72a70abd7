"""What WORLD means for every other group, asked here once and nowhere else.

Registered, WORLD decides three things for the groups around it: whether every new group must
be reloadable (a destroy of WORLD tears down every group torch knows, slime's rule), whether
the next destroy swaps WORLD (and so tears every group down, once more at the reload), and
which way a new group may take in such a world (only one its way makes anew at each reload,
behind its wrapper). The ways are asked one question (``Way.makes_anew``); no module outside
``world/`` branches on WORLD. The doctor reads WORLD here too: WORLD as the program holds it,
its native group, the backends it names, and the groups every cycle leaves alone.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from .. import mode, policy, ways
from ..backends import component_names
from ..store import channel
from ..ways.base import Way
from . import carry
from .end import native_world


def destroys_every_group() -> bool:
    """Whether every group must be reloadable once WORLD is registered (slime's rule): a
    destroy of WORLD tears down every group torch knows. A WORLD that suspends does not."""
    world = channel.registration()
    record = world.record if world is not None else None
    return world is not None and not (record is not None and record.way.suspends)


def wraps(ranks: Any, backend: Any) -> bool:
    """Whether the wrap policy makes a new group of ``ranks`` and ``backend`` reloadable, in
    this world (every group, once WORLD is registered to be destroyed: slime's rule)."""
    return policy.should_wrap(ranks, backend, destroys_every_group())


def needs_swap() -> bool:
    """Whether the next destroy replaces WORLD (registered, accelerator, not swapped yet)."""
    world = channel.registration()
    return world is not None and world.swap and not world.swapped


def _torn_down(way: Way) -> str | None:
    """Why ``way`` cannot hold a group in a world whose WORLD is swapped at every destroy."""
    if way.makes_anew:
        return None
    return (
        "WORLD is registered and swapped for a temporary WORLD on destroy, which destroys "
        f"every group torch knows; register WORLD in {mode.get_reload_mode()} mode too"
    )


def choose_group_way(native: Any) -> Way | None:
    """The way of a new group (``ways.choose``), where a swapped WORLD allows only the ways
    that make their group anew at each reload."""
    return ways.choose(native, refuse=_torn_down if needs_swap() else None)


def held() -> list[Any]:
    """WORLD as the program holds it (its stand-in while it sleeps), or none before
    ``init_process_group``."""
    return [dist.GroupMember.WORLD] if dist.is_initialized() else []


def native() -> Any:
    """WORLD's native group, also behind its stand-in while it sleeps (its record keeps it);
    None before ``init_process_group``."""
    return native_world() if dist.is_initialized() else None


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
    registered = channel.registration()
    if registered is None or not registered.swap:
        return found, []
    return found, [
        f"the next destroy_process_groups() will refuse: {line}" for line in carry.obstacles(groups)
    ]
