"""How a reloadable group reloads: behind a wrapper, or in place (torch 2.14+).

``wrapper`` (the default): a reload creates a new native group, and the program keeps holding a
``ReloadableProcessGroup`` that points at it. ``native``: torch 2.14 can rebuild a group's
communicator inside the same ``ProcessGroup`` object (``ProcessGroup.reconfigure``), so the
program holds torch's own group, before and after every reload, and nothing needs to stand in
for it; a group that cannot do that is refused loudly. ``auto``: in place where the group can,
behind a wrapper where it cannot. Chosen with ``SLIME_RELOADABLE_PG_MODE`` or
``set_reload_mode``; the default stays ``wrapper`` until the NCCL path has been measured on a GPU.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist

from .._env import MODE_ENV, MODES
from ..errors import ModeRefusedError
from . import settings
from .backends import device_backends

logger = logging.getLogger("reloadpg_autopatch")


def _checked(mode: object) -> str:
    if not isinstance(mode, str) or mode.strip().lower() not in MODES:
        raise ValueError(f"reload mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    return mode.strip().lower()


def set_reload_mode(mode: str) -> None:
    """Choose how new reloadable groups reload: ``"wrapper"``, ``"native"`` or ``"auto"``."""
    chosen = _checked(mode)
    held = settings.current()
    with held.lock:
        held.mode = chosen


def get_reload_mode() -> str:
    """The mode in force: set by ``set_reload_mode``, else ``SLIME_RELOADABLE_PG_MODE``."""
    chosen = settings.current().mode
    if chosen is not None:
        return chosen
    raw = os.environ.get(MODE_ENV, "").strip()
    if not raw:
        return "wrapper"
    try:
        return _checked(raw)
    except ValueError:
        return "wrapper"  # reported once at start-up, by the bootstrap


def torch_can_reconfigure() -> bool:
    """Whether the installed torch rebuilds a group in place (``ProcessGroup.reconfigure``)."""
    return hasattr(dist.ProcessGroup, "reconfigure") and hasattr(
        dist.ProcessGroup, "get_reconfigure_handle"
    )


def in_place_refusal(group: Any) -> str | None:
    """Why ``group`` cannot be reloaded in place, or None when it can."""
    if not torch_can_reconfigure():
        return f"torch {torch.__version__} has no ProcessGroup.reconfigure (torch 2.14 and later)"
    backends = {id(backend): backend for _device, backend in device_backends(group)}
    if len(backends) > 1:
        names = sorted({type(b).__name__ for b in backends.values()})
        return (
            f"it has several backends ({', '.join(names)}), and torch reconfigures a group with "
            "one backend only"
        )
    if any(type(b).__name__ == "_ProcessGroupWrapper" for b in backends.values()):
        return (
            "TORCH_DISTRIBUTED_DEBUG=DETAIL wraps its backend in torch's _ProcessGroupWrapper "
            "(which checks every collective's arguments across ranks), and that wrapper cannot "
            "reconfigure; unset TORCH_DISTRIBUTED_DEBUG (or set it to INFO) for native mode"
        )
    try:
        supported = bool(getattr(group, "supports_reconfigure", False))
    except RuntimeError as error:  # torch refuses to answer for some groups
        return str(error)
    if not supported:
        name = next(iter(backends.values()), None)
        label = type(name).__name__ if name is not None else "its backend"
        return f"{label} does not support reconfigure (gloo and nccl2 do; nccl does not)"
    return None


def copy_as_handle() -> None:
    """Make ``copy.copy``/``copy.deepcopy`` of a native group return the group itself.

    In native mode the program holds torch's own groups, and torch's class cannot be copied
    (``cannot pickle ProcessGroup``); behind a wrapper a group is a handle, and copying it gives
    the same group (Megatron deep-copies configs that hold groups). Native mode must not be a
    different library, so once a group reloads in place, torch's class copies like the wrapper.
    """
    cls = dist.ProcessGroup
    if "__copy__" not in cls.__dict__:
        cls.__copy__ = _same  # type: ignore[attr-defined]
        cls.__deepcopy__ = _same_deep  # type: ignore[attr-defined]


def _same(self: Any) -> Any:
    return self


def _same_deep(self: Any, memo: dict[int, Any]) -> Any:
    return self


def reloads_in_place(group: Any) -> bool:
    """Whether a new native group reloads in place, per the mode in force.

    In ``native`` mode a group that cannot is refused with a ``RuntimeError`` naming why.
    """
    mode = get_reload_mode()
    if mode == "wrapper":
        return False
    refusal = in_place_refusal(group)
    if refusal is None:
        return True
    if mode == "native":
        raise ModeRefusedError(
            f"{MODE_ENV}=native (or set_reload_mode('native')) but group "
            f"{getattr(group, 'group_name', '?')!r} cannot be reloaded in place: {refusal}; "
            "use mode 'auto' to reload such groups behind a wrapper, or 'wrapper' for all"
        )
    return False
