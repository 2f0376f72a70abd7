"""The patch set of this process: what it replaced, with what, and where; the sweep and the
doctor read it, ``install`` is the one place that changes what is installed."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

#: Serialises applying the patch. Recreated in a forked child, which may have been forked
#: while another thread held it.
LOCK = threading.RLock()


def _reset_lock_in_child() -> None:
    global LOCK
    LOCK = threading.RLock()


os.register_at_fork(after_in_child=_reset_lock_in_child)


@dataclass
class PatchSet:
    """torch's originals and our wrappers, by name, and where each wrapper was installed."""

    #: ``torch.distributed`` name -> torch's original.
    originals: dict[str, Any]
    #: ``torch.distributed`` name -> our wrapper, installed in the namespace.
    wrappers: dict[str, Any]
    #: ``distributed_c10d`` name -> our wrapper, installed where torch defines the function.
    c10d: dict[str, Any] = field(default_factory=dict)
    #: The names that create or destroy groups: all a process needs whose groups all reload in
    #: place (native mode), where nothing stands in for a group and collectives stay torch's.
    lifecycle: frozenset[str] = frozenset()
    #: The names installed now: every name, or only ``lifecycle`` until something needs more.
    installed: set[str] = field(default_factory=set)
    #: id(original) -> (original, wrapper) for the installed names: the sweep looks values up
    #: by id. A module that bound an original gets the wrapper of the place torch defines it.
    by_original_id: dict[int, tuple[Any, Any]] = field(default_factory=dict)

    def mark_installed(self, names: set[str]) -> None:
        self.installed |= names
        self.by_original_id = {
            id(self.originals[name]): (
                self.originals[name],
                self.c10d.get(name, self.wrappers[name]),
            )
            for name in self.installed
        }

    @property
    def complete(self) -> bool:
        return self.installed >= set(self.wrappers)


_CURRENT: PatchSet | None = None


def current() -> PatchSet | None:
    """The patch of this process, or None when ``torch.distributed`` is untouched."""
    return _CURRENT


def set_current(patch: PatchSet) -> None:
    global _CURRENT
    _CURRENT = patch


def is_patched() -> bool:
    """Whether ``monkey_patch_torch_dist()`` has run in this process."""
    return _CURRENT is not None


def patched_names() -> list[str]:
    """The ``torch.distributed`` names this process's patch replaced."""
    return sorted(_CURRENT.installed) if _CURRENT is not None else []
