"""The lifecycle of reloadable groups, in one place to start reading: the public steps.

A group is created (``creation``) with a way chosen once (``ways.choose``), destroyed and
reloaded with every other one in a cycle (``destroy``, ``reload``: thin drivers that ask each
record's way for its step and have the way carry it out), and released for good by the program
(``release``) or with its world (``world.end``). WORLD, once registered (``world.registration``),
is the first record. This process's state is one holder in parts (``process``), and the
program's choices one object (``settings``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

from .. import _env, _originals
from ..errors import ReloadPGError
from . import destroy, process, registry, reload
from .creation import create, refuse_while_asleep
from .release import release
from .report import CycleReport
from .stepping import threaded_world
from .unwrap import unwrap
from .world import registration
from .world.end import destroy_group_or_world

_Step = TypeVar("_Step", bound=Callable[..., Any])


def not_active_error(call: str) -> ReloadPGError:
    """The error for a lifecycle call in a process where the package never activated.

    Activating here instead is not safe: groups made before it are torch's own and unknown to
    the lifecycle (nothing of theirs would be freed), and modules that bound torch's functions
    at import keep the originals, so the process would run half-patched, silently. And a
    process that asked for activation (the gate on) and did not get it has a broken install,
    which this must not hide.
    """
    gate = os.environ.get(_env.GATE)
    if (gate or "").strip().lower() in _env.ON_VALUES:
        why = (
            f"{_env.GATE}={_env.excerpt(gate)} is on, but the package's .pth never ran: it is "
            "installed where site never looks (pip install --target DIR, or a directory on "
            "PYTHONPATH: site runs .pth files only in site-packages), or Python ran with -S"
        )
    else:
        why = f"{_env.GATE} is {'unset' if gate is None else f'{_env.excerpt(gate)}, off'}"
    return ReloadPGError(
        f"reloadpg_autopatch.{call}(): the package is not active in this process (torch."
        f"distributed was never patched: {why}), so no group is reloadable and this would do "
        "nothing. Install the package into the interpreter's site-packages and set "
        f"{_env.GATE}=1 where the process starts, or call "
        "reloadpg_autopatch.monkey_patch_torch_dist() before torch.distributed is used; "
        "`python -m reloadpg_autopatch doctor` says what it finds. To run the same program "
        "without the package, guard the call with reloadpg_autopatch.is_patched()"
    )


def _active(step: _Step) -> _Step:
    """``step``, refused loudly where the package never activated (never a silent no-op)."""

    @functools.wraps(step)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if not _originals.patched():
            raise not_active_error(step.__name__)
        return step(*args, **kwargs)

    return checked  # type: ignore[return-value]


def _ours(step: _Step) -> _Step:
    """``step``, whose every failure is a ``ReloadPGError`` (the program's handler for the
    cycle catches one type): anything else it met is wrapped, the original as its cause.
    ``KeyboardInterrupt``, ``SystemExit`` and the like go through as they are."""

    @functools.wraps(step)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            return step(*args, **kwargs)
        except ReloadPGError:
            raise
        except Exception as error:
            raise ReloadPGError(
                f"reloadpg_autopatch.{step.__name__}() failed on this rank: "
                f"{type(error).__name__}: {error}"
            ) from error

    return checked  # type: ignore[return-value]


destroy_process_groups = _active(_ours(destroy.destroy_process_groups))
reload_process_groups = _active(_ours(reload.reload_process_groups))
register_default_process_group = _active(registration.register_default_process_group)

__all__ = [
    "create",
    "destroy_process_group",
    "destroy_process_groups",
    "last_cycle_report",
    "not_active_error",
    "refuse_while_asleep",
    "register_default_process_group",
    "release",
    "reload_process_groups",
    "reloadable_groups",
    "threaded_world",
    "unwrap",
]


def destroy_process_group(destroy: Callable[..., Any], group: Any) -> Any:
    """torch's ``destroy_process_group`` (``destroy``) of ``group``, as the program calls it:
    one of our groups is released for good (reload will not revive it); WORLD, or nothing,
    ends the world (every group torch knows, and this world's records)."""
    if release(group):
        return None
    return destroy_group_or_world(destroy, unwrap(group))


def reloadable_groups() -> list[Any]:
    """The reloadable groups of this process that the program still holds, awake or asleep.

    Wrappers, and in native and suspend modes torch's own groups; a group released while it
    sleeps suspended (``destroy_process_group(g)``) is no longer held, and a broken one no
    reload brings back (each way says: ``Way.listed``).
    """
    return [record.held for record in registry.members() if record.way.listed(record)]


def last_cycle_report() -> CycleReport | None:
    """The report of this rank's latest destroy/reload cycle (None before the first destroy,
    and in a forked child, which holds none of its parent's groups)."""
    return process.current().last_report
