"""The one holder of this process's lifecycle state, and its lock; fork-safe.

Everything the lifecycle knows about this process lives in one ``ProcessState``: the records in
creation order, WORLD's registration, and the counters that make every rendezvous key unique
(the world epoch and the cycle generation). A forked child inherits the parent's memory but
never its groups (their communicators belong to the parent), so it starts from a fresh holder
with a fresh lock: a fork taken while another thread held the lock would otherwise leave the
child unable to take it.
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
        #: Outer ``new_group`` layers we stepped back for (warned once each).
        self.outer_layers: set[str] = set()

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


def _reset_in_child() -> None:
    global _STATE, _CREATE
    _STATE = None
    _CREATE = threading.Lock()


os.register_at_fork(after_in_child=_reset_in_child)
