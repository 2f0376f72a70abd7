"""What the patch of this process replaced: the one record the sweep and the doctor read."""

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
class PatchState:
    """torch's originals and our wrappers, by name, and where each wrapper was installed."""

    originals: dict[str, Any]
    wrappers: dict[str, Any]
    #: id(original) -> (original, wrapper), built once: the sweep looks values up by id.
    by_original_id: dict[int, tuple[Any, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.by_original_id = {
            id(original): (original, self.wrappers[name])
            for name, original in self.originals.items()
        }


_STATE: PatchState | None = None


def current() -> PatchState | None:
    """The patch of this process, or None when ``torch.distributed`` is untouched."""
    return _STATE


def set_current(patch: PatchState) -> None:
    global _STATE
    _STATE = patch


def is_patched() -> bool:
    """Whether ``monkey_patch_torch_dist()`` has run in this process."""
    return _STATE is not None


def patched_names() -> list[str]:
    """The ``torch.distributed`` names this process's patch replaced."""
    return sorted(_STATE.wrappers) if _STATE is not None else []
