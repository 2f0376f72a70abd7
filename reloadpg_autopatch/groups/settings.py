"""What the program chose for this process, kept across fork: one object, one lock.

The reload mode, the wrap policy, the memory guard and its probe, and the reload hooks are the
program's choices, not the lifecycle's state: a forked child that starts a WORLD of its own
keeps them (a DataLoader worker runs the parent's code), so a fork resets none of them. Only the
lock is made anew in a child, because a fork taken while another thread held it would leave the
child unable to take it. Everything the lifecycle knows about its groups is elsewhere, in the
process holder (``process.ProcessState``), which a fork does replace.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class MemoryGuard(NamedTuple):
    """The guard's settings: the free memory it wants, and whether it checks every call."""

    min_free_gb: float
    every_call: bool


#: A reload hook entry: its name, then its ``before_destroy`` and ``after_reload`` callables.
HookEntry = tuple[str, "Callable[[list[Any]], Any] | None", "Callable[[list[Any]], Any] | None"]


@dataclass
class Settings:
    """The program's choices; read and written under ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    #: The memory guard (None: not read from the environment yet).
    guard: MemoryGuard | None = None
    #: The memory query and the device types it answers for (None: torch's own, every
    #: accelerator type), and what the guard runs to make room (None: empty the cache).
    probe: Callable[[Any], Any] | None = None
    probe_types: frozenset[str] | None = None
    clear: Callable[[Any], None] | None = None
    #: ``set_reload_mode``'s choice (None: the environment decides).
    mode: str | None = None
    #: ``set_wrap_policy``'s choice: a policy name or a callable.
    policy: Any = "auto"
    #: The reload hooks by handle key, in registration order.
    hooks: dict[int, HookEntry] = field(default_factory=dict)
    keys: Any = field(default_factory=itertools.count)


_SETTINGS = Settings()


def current() -> Settings:
    """This process's settings (inherited by a forked child, with a fresh lock)."""
    return _SETTINGS


def _new_lock_in_child() -> None:
    _SETTINGS.lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)
