"""Reload hooks: a framework's own code before each destroy and after each reload.

Some state lives beside a communicator and dies with it: Megatron's NCCL memory pools
registered on a group's backend, TransformerEngine's expert-parallel bootstrap, symmetric-memory
handles. No general rule can know all of it, so a framework registers a hook that tears it down
before a destroy and builds it again after a reload, given the groups concerned.

A hook that raises does not stop the step: destroy and reload are collective, and a rank that
stopped halfway would leave its peers waiting at the next rendezvous. The step completes, every
other hook runs, and then ``ReloadHookError`` names the hook and carries its error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..errors import ReloadHookError
from . import mode, settings

logger = logging.getLogger("reloadpg_autopatch")

Hook = Callable[[list[Any]], Any]

PHASES = ("before_destroy", "after_reload")


__all__ = ["ReloadHookError", "ReloadHookHandle", "add_reload_hook", "registered", "run"]


class ReloadHookHandle:
    """What ``add_reload_hook`` returns: ``remove()`` unregisters the hook (idempotent)."""

    def __init__(self, key: int, name: str) -> None:
        self._key = key
        self.name = name

    def remove(self) -> None:
        held = settings.current()
        with held.lock:
            held.hooks.pop(self._key, None)

    def __repr__(self) -> str:
        return f"<ReloadHookHandle {self.name!r}>"


def _name_of(hook: Any) -> str:
    return getattr(hook, "__qualname__", None) or getattr(hook, "__name__", None) or repr(hook)


def add_reload_hook(
    *,
    before_destroy: Hook | None = None,
    after_reload: Hook | None = None,
    name: str | None = None,
) -> ReloadHookHandle:
    """Run ``before_destroy(groups)`` before each destroy and ``after_reload(groups)`` after
    each reload, on this rank.

    ``before_destroy`` gets the groups about to lose their communicators, ``after_reload`` the
    groups just rebuilt, in creation order (wrappers; in native mode torch's own groups). Hooks
    run in registration order. A hook that raises makes the step raise ``ReloadHookError``
    once it has completed. ``name`` (default: the callable's qualified name) is what errors
    and logs call it.
    """
    if before_destroy is None and after_reload is None:
        raise TypeError("add_reload_hook() needs before_destroy=, after_reload= or both")
    for phase, hook in (("before_destroy", before_destroy), ("after_reload", after_reload)):
        if hook is not None and not callable(hook):
            raise TypeError(f"{phase} must be a callable taking a list of groups, got {hook!r}")
    if name is None:
        name = _name_of(before_destroy if before_destroy is not None else after_reload)
    elif not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    held = settings.current()
    with held.lock:
        key = next(held.keys)
        held.hooks[key] = (name, before_destroy, after_reload)
    return ReloadHookHandle(key, name)


def registered() -> list[str]:
    """The names of the hooks registered now, in registration order."""
    held = settings.current()
    with held.lock:
        return [entry[0] for entry in held.hooks.values()]


def run(phase: str, groups: list[Any]) -> list[tuple[str, BaseException]]:
    """Run every hook of ``phase``; return the failures as ``(name, error)``, in order."""
    index = PHASES.index(phase) + 1
    held = settings.current()
    with held.lock:
        chosen = [(entry[0], entry[index]) for entry in held.hooks.values() if entry[index]]
    failures = []
    for name, hook in chosen:
        try:
            hook(list(groups))
        except Exception as error:
            logger.error("reload hook %r (%s) raised %r", name, phase, error)
            failures.append((name, error))
    return failures


def _after(phase: str) -> str:
    """What the groups are once ``phase``'s step completed, in the words of the mode in force."""
    if phase != "before_destroy":
        return "live"
    return {
        "suspend": "asleep (suspended in place; gloo groups stay awake)",
        "auto": "asleep (suspended, or destroyed to be re-created, each as its way does)",
    }.get(mode.get_reload_mode(), "destroyed")


def error_for(phase: str, failures: list[tuple[str, BaseException]]) -> ReloadHookError:
    """One error naming every failed hook of ``phase``, caused by the first one's error."""
    step = "destroy_process_groups()" if phase == "before_destroy" else "reload_process_groups()"
    parts = [f"{name!r} raised {type(err).__name__}: {err}" for name, err in failures]
    error = ReloadHookError(
        f"reload hook {'; '.join(parts)} ({phase}); {step} completed on this rank, so the "
        f"groups are {_after(phase)}: fix the hook"
    )
    error.__cause__ = failures[0][1]
    return error
