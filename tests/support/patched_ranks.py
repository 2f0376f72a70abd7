"""A rank patched by an explicit call, every group wrapped, and a spy that counts the native
groups torch builds (at ``distributed_c10d._new_process_group_helper``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from tests.support.ranks import Rank

TIMEOUT = timedelta(seconds=30)


class NativeSpy:
    """Counts the native groups torch builds in this process (this rank a member).

    Every native group, WORLD included, comes out of ``_new_process_group_helper``; non-members
    get ``NON_GROUP_MEMBER`` from it and are not counted.
    """

    def __init__(self) -> None:
        from torch.distributed import distributed_c10d as c10d

        self.created = 0
        original = c10d._new_process_group_helper

        def helper(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if isinstance(result[0], c10d.ProcessGroup):
                self.created += 1
            return result

        c10d._new_process_group_helper = helper

    def during(self, call: Any) -> int:
        """How many native groups ``call()`` made torch build."""
        before = self.created
        call()
        return self.created - before


def start(ctx: Rank, registered: bool) -> Any:
    """Patch, wrap every group, join WORLD; with ``registered`` WORLD goes through the swap."""
    import reloadpg_autopatch as rpg

    dist = ctx.patched("all")
    if registered:
        rpg.register_default_process_group(TIMEOUT, accelerator_backends=("gloo",))
    return dist
