"""Ranks for the memory guard, hook and report tests: joined to WORLD with every group wrapped,
and the package's log records kept in the rank.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from tests.support.ranks import Rank

TIMEOUT = timedelta(seconds=30)


def begin(ctx: Rank, policy: str = "all") -> Any:
    """Join WORLD in a rank the gate patched at start-up; return torch.distributed."""
    return ctx.begin(policy=policy, timeout=TIMEOUT.total_seconds())


def dist_new_group() -> Any:
    import torch.distributed as dist

    return dist.new_group([0, 1])


def records(level: int = 10) -> list[Any]:
    """Collect the ``reloadpg_autopatch`` logger's records from now on (in this rank)."""
    import logging

    records: list[Any] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("reloadpg_autopatch")
    logger.addHandler(Keep(level))
    logger.setLevel(min(logger.getEffectiveLevel(), level))
    return records
