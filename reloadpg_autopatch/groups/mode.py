"""The reload mode: which ways a new group may take (``ways.MODES``), chosen by the program.

``wrapper`` (the default): every group behind a ``ReloadableProcessGroup``, destroyed and
created again. ``native``: torch's own group, rebuilt in place (``ProcessGroup.reconfigure``,
torch 2.14); a group that cannot be is refused loudly. ``suspend``: each accelerator group's
communicator suspended and resumed (``Backend.suspend()``, NCCL 2.29.7+), every object kept;
groups on a CPU backend (gloo) are left alone, awake; a group with an accelerator backend that
cannot suspend is refused loudly. ``auto``: suspend where the backend can, else in place, else
behind a wrapper. Chosen with ``SLIME_RELOADABLE_PG_MODE`` or ``set_reload_mode``; the default
stays ``wrapper`` until the NCCL paths have run on a GPU. The choice for each group is
``ways.choose``.
"""

from __future__ import annotations

import logging
import os

from .._env import MODE_ENV, MODES, MODES_GROUP, first_report, mode_problem
from . import settings

logger = logging.getLogger("reloadpg_autopatch")


#: The modes there are: the built-in ones, and any a registered way added (``add``).
_KNOWN: list[str] = list(MODES)


def add(name: str) -> None:
    """A mode named ``name`` exists from now on (``ways.register``)."""
    if name not in _KNOWN:
        _KNOWN.append(name)


def _resolve(name: str) -> str | None:
    """The mode ``name`` means: a built-in one (any case), one a way registered, or one an
    installed distribution registers (``_from_plugin``); None when there is none."""
    value = name.strip()
    if value.lower() in MODES:
        return value.lower()
    if value in _KNOWN or _from_plugin(value):
        return value
    return None


def _checked(mode: object) -> str:
    chosen = _resolve(mode) if isinstance(mode, str) else None
    if chosen is None:
        known = ", ".join(map(repr, _KNOWN))
        raise ValueError(f"reload mode must be one of {known}, got {mode!r}")
    return chosen


def set_reload_mode(mode: str) -> None:
    """Choose how new reloadable groups reload: ``"wrapper"``, ``"native"``, ``"suspend"`` or
    ``"auto"``."""
    chosen = _checked(mode)
    held = settings.current()
    with held.lock:
        held.mode = chosen


#: The plugin modes looked for already (``_from_plugin``), found or not.
_LOOKED_FOR: set[str] = set()


def _from_plugin(name: str) -> bool:
    """Whether a mode named ``name`` exists once the entry point of that name in
    ``MODES_GROUP`` is loaded (importing its target registers the mode); looked for once."""
    if name not in _LOOKED_FOR:
        _LOOKED_FOR.add(name)
        try:
            from importlib.metadata import entry_points

            for point in entry_points(group=MODES_GROUP):
                if point.name == name:
                    point.load()
                    break
        except Exception as error:  # a broken plugin: said once, and the mode is unknown
            logger.warning("loading the mode %r from %s failed: %r", name, MODES_GROUP, error)
    return name in _KNOWN


def get_reload_mode() -> str:
    """The mode in force: set by ``set_reload_mode``, else ``SLIME_RELOADABLE_PG_MODE`` (a
    built-in mode, or one an installed distribution registers: ``_env.MODES_GROUP``)."""
    chosen = settings.current().mode
    if chosen is not None:
        return chosen
    raw = os.environ.get(MODE_ENV, "")
    if not raw.strip():
        return "wrapper"
    chosen = _resolve(raw)
    if chosen is not None:
        return chosen
    problem = mode_problem(raw)
    if problem is not None and first_report(MODE_ENV, raw):  # once, whoever read it first
        logger.warning("%s", problem)
    return "wrapper"
