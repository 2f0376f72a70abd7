"""How a reloadable group sleeps and wakes: behind a wrapper, in place, or suspended.

``wrapper`` (the default): a reload creates a new native group, and the program keeps holding a
``ReloadableProcessGroup`` that points at it. ``native``: torch 2.14 can rebuild a group's
communicator inside the same ``ProcessGroup`` object (``ProcessGroup.reconfigure``), so the
program holds torch's own group, before and after every reload, and nothing needs to stand in
for it; a group that cannot do that is refused loudly. ``suspend``: destroy suspends each
accelerator group's communicator (``Backend.suspend()``, NCCL 2.29.7+) and reload resumes it,
keeping every object; groups on a CPU backend (gloo) are left alone, awake; a group with an
accelerator backend that cannot suspend is refused loudly. ``auto``: suspend where the backend
can, else in place, else behind a wrapper. Chosen with ``SLIME_RELOADABLE_PG_MODE`` or
``set_reload_mode``; the default stays ``wrapper`` until the NCCL paths have run on a GPU.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist

from .._env import MODE_ENV, MODES
from ..errors import ModeRefusedError
from . import settings, suspended
from .backends import device_backends
from .record import Way

logger = logging.getLogger("reloadpg_autopatch")


def _checked(mode: object) -> str:
    if not isinstance(mode, str) or mode.strip().lower() not in MODES:
        raise ValueError(f"reload mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    return mode.strip().lower()


def set_reload_mode(mode: str) -> None:
    """Choose how new reloadable groups reload: ``"wrapper"``, ``"native"``, ``"suspend"`` or
    ``"auto"``."""
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


def suspend_refusal(group: Any, capability: suspended.Capability | None = None) -> str | None:
    """Why ``group`` cannot suspend in place, or None when it can."""
    if not suspended.torch_can_suspend():
        return f"torch {torch.__version__} has no Backend.suspend (torch 2.12 and later)"
    found = capability if capability is not None else suspended.capability(group)
    if found.refusals:
        return "; ".join(found.refusals)
    if not found.legs:
        return "it has no backend that holds accelerator memory (a CPU backend stays awake)"
    return None


def way_for(group: Any, *, world_swaps: bool) -> Way | None:
    """How a new member's group sleeps and wakes, per the mode in force; None: left alone.

    ``world_swaps``: WORLD is swapped on destroy, which destroys every group torch knows, so no
    group can sleep in place. In ``native`` and ``suspend`` modes a group that cannot be
    reloaded as asked is refused with a ``ModeRefusedError`` naming why; in ``suspend`` mode a
    group on a CPU backend only (gloo) is left alone: it holds no accelerator memory and stays
    usable while the others sleep.
    """
    mode = get_reload_mode()
    if mode == "wrapper":
        return Way.WRAPPER
    name = getattr(group, "group_name", "?")
    if mode in ("suspend", "auto"):
        found = suspended.capability(group) if suspended.torch_can_suspend() else None
        refusal = suspend_refusal(group, found)
        if refusal is None and not world_swaps:
            return Way.SUSPEND if suspended.torch_has_pre_hooks() else Way.SUSPEND_WRAPPED
        if mode == "suspend":
            if found is not None and found.cpu_only:
                return None
            raise ModeRefusedError(
                f"{MODE_ENV}=suspend (or set_reload_mode('suspend')) but group {name!r} cannot "
                "be suspended in place: "
                + (
                    "WORLD is registered and swapped for a temporary WORLD on destroy, which "
                    "destroys every group; register WORLD in suspend mode too"
                    if refusal is None
                    else refusal
                )
                + "; use mode 'auto' to reload such groups another way"
            )
    if world_swaps:
        if mode == "native" and in_place_refusal(group) is None:
            raise ModeRefusedError(
                f"group {name!r} cannot be reloaded in place: WORLD is registered and swapped "
                "for a temporary WORLD on destroy, which destroys every group; register WORLD "
                "in native mode too, or use mode 'auto'"
            )
        if mode != "native":
            return Way.WRAPPER
    return Way.IN_PLACE if reloads_in_place(group) else Way.WRAPPER
