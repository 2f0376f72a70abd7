"""The lifecycle of reloadable groups, in one place to start reading: the public steps.

A group is created (``creation``) with a way chosen once (``ways.choose``), destroyed and
reloaded with every other one in a cycle (``destroy``, ``reload``: thin drivers that ask each
record's way for its step and have the way carry it out), and released for good by the program
(``release``) or with its world (``world.end``). WORLD, once registered (``world.registration``),
is the first record. This process's state is one holder in parts (``process``), and the
program's choices one object (``settings``).
"""

from __future__ import annotations

from typing import Any

from . import process, registry
from .creation import create, refuse_while_asleep
from .destroy import destroy_process_groups
from .record import State
from .release import release
from .reload import reload_process_groups
from .report import CycleReport
from .stepping import threaded_world
from .unwrap import unwrap
from .world.end import end_world, wake_before_world_ends
from .world.swap import native_world

__all__ = [
    "create",
    "destroy_process_groups",
    "end_world",
    "last_cycle_report",
    "native_world",
    "refuse_while_asleep",
    "release",
    "reload_process_groups",
    "reloadable_groups",
    "threaded_world",
    "unwrap",
    "wake_before_world_ends",
]


def reloadable_groups() -> list[Any]:
    """The reloadable groups of this process that the program still holds.

    Wrappers, and in native mode torch's own groups.
    """
    out = []
    for record in registry.members():
        held = record.held
        live = record.state in (State.LIVE, State.DESTROYED)
        if record.way.program_group and held is not None and live:
            out.append(held)
    return out


def last_cycle_report() -> CycleReport | None:
    """The report of this rank's latest destroy/reload cycle (None before the first destroy,
    and in a forked child, which holds none of its parent's groups)."""
    return process.current().last_report
