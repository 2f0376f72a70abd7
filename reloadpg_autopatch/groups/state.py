"""The one holder of this process's lifecycle state, and its lock; fork-safe.

Everything the lifecycle knows about this process lives in one ``ProcessState``: the records in
creation order, WORLD's registration, and the counters that make every rendezvous key unique
(the world epoch and the cycle generation). A forked child inherits the parent's memory but
never its groups (their communicators belong to the parent), so it starts from a fresh holder
with a fresh lock: a fork taken while another thread held the lock would otherwise leave the
child unable to take it. The parent's holder is kept alive in the child, never used and never
freed: dropping it would run torch destructors (gloo joins threads that exist only in the
parent) on objects whose communicators belong to the parent, and crash the child.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .record import Record
    from .world import Registration


class ProcessState:
    """This process's groups and the counters that name their rendezvous keys."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        #: Every recorded creation still of use, in creation order.
        self.records: list[Record] = []
        #: WORLD's registration (``register_default_process_group``), if any.
        self.world: Registration | None = None
        #: The default group the records belong to; another one means a new world.
        self.known_world: Any = None
        #: Worlds this process has ended (a program-level WORLD destroy ends one).
        self.epoch = 0
        #: Destroy and reload steps taken in this world; each gets its own keys.
        self.generation = 0
        #: Between ``destroy_process_groups()`` and ``reload_process_groups()``.
        self.asleep = False
        #: The destroy or reload step running now in some thread of this process, if any.
        self.step: str | None = None
        #: Outer ``new_group`` layers we stepped back for (warned once each).
        self.outer_layers: set[str] = set()
        #: In a forked child: the parent's WORLD, which this process must never take part in.
        #: While it is still the default group, destroy and reload have nothing to do here.
        self.parents_world: Any = None

    @property
    def in_parents_world(self) -> bool:
        """Whether this is a forked child still inside its parent's WORLD (it holds no group)."""
        parents = self.parents_world
        if parents is None:
            return False
        from torch.distributed import distributed_c10d as c10d

        return c10d._world.default_pg is parents

    def key(self, *parts: object) -> str:
        """A store key no other world or generation of this job uses."""
        tail = "/".join(str(p) for p in parts)
        return f"reloadpg_autopatch/{self.epoch}/{self.generation}/{tail}"


_STATE: ProcessState | None = None
_CREATE = threading.Lock()


def current() -> ProcessState:
    """This process's state, created on first use."""
    global _STATE
    state = _STATE
    if state is None:
        with _CREATE:
            if _STATE is None:
                _STATE = ProcessState()
            state = _STATE
    return state


#: The holders this process inherited through fork: referenced for ever, never used.
_INHERITED: list[ProcessState] = []


def _reset_in_child() -> None:
    global _STATE, _CREATE
    inherited = _STATE
    _CREATE = threading.Lock()
    if inherited is not None:
        _INHERITED.append(inherited)  # never freed here: see the module's docstring
    fresh = ProcessState()
    fresh.parents_world = (inherited and inherited.parents_world) or _default_group()
    _STATE = fresh


def _default_group() -> Any:
    """The default group now, without importing torch into a process that has not."""
    import sys

    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    return getattr(getattr(c10d, "_world", None), "default_pg", None)


os.register_at_fork(after_in_child=_reset_in_child)
