"""What WORLD means for every other group, asked here once and nowhere else.

Registered, WORLD decides three things for the groups around it: whether every new group must
be reloadable (a destroy of WORLD tears down every group torch knows, slime's rule), whether
the next destroy swaps WORLD (and so tears every group down, once more at the reload), and
which way a new group may take in such a world (only one its way makes anew at each reload,
behind its wrapper). The ways are asked one question (``Way.makes_anew``); no module outside
``world/`` branches on WORLD.
"""

from __future__ import annotations

from typing import Any

from .. import mode, policy, ways
from ..store import channel
from ..ways.base import Way


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
