"""A rank joined to WORLD with every group reloadable, WORLD's gloo swap, and a count of the
default groups torch builds (WORLD swapped out and restored).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from tests.support.ranks import Rank

TIMEOUT = timedelta(seconds=30)
#: WORLD's timeout where a test bounds a step by it: a mismatch shows as a wait this long.
SHORT = timedelta(seconds=10)
SWAP = ("gloo",)


def begin(ctx: Rank, timeout: timedelta = TIMEOUT) -> Any:
    """Join WORLD in a rank the gate patched at start-up; every group reloadable."""
    return ctx.begin(timeout=timeout.total_seconds())


class DefaultGroups:
    """Counts the default groups torch builds (``init_process_group`` passes this group_desc
    to ``_new_process_group_helper``, whichever reference to it a caller holds)."""

    def __init__(self) -> None:
        from torch.distributed import distributed_c10d as c10d

        self.built = 0
        self._helper = c10d._new_process_group_helper
        c10d._new_process_group_helper = self._counting

    def _counting(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("group_desc") == "default_pg":
            self.built += 1
        return self._helper(*args, **kwargs)


def error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
