"""The adoption's switch: ``SLIME_RELOADABLE_PG_ADOPT`` and the lifecycle modules watched."""

from __future__ import annotations

import logging
import os

from .. import _env

logger = logging.getLogger("reloadpg_autopatch")

_REPORTED: set[str] = set()


def modules() -> tuple[str, ...]:
    """The lifecycle modules adopted: slime's, miles', vime's and those the variable adds."""
    return _env.parse_adopt_modules(os.environ.get(_env.ADOPT_MODULES_ENV))[0]


def setting() -> tuple[bool, str | None]:
    """``(adopt, problem)`` from ``SLIME_RELOADABLE_PG_ADOPT``; a bad value adopts nothing."""
    try:
        return _env.parse_adopt(os.environ.get(_env.ADOPT_ENV)), None
    except ValueError as error:
        return False, str(error)


def _gate_reported() -> bool:
    """Start-up reports a bad value of ours when the gate is on: the line is not repeated."""
    return os.environ.get(_env.GATE, "").strip().lower() in _env.ON_VALUES


def report(problem: str) -> None:
    """Say ``problem`` once in this process, unless start-up said it already."""
    if problem in _REPORTED or _gate_reported():
        return
    _REPORTED.add(problem)
    logger.warning("%s", problem)
