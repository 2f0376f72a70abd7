"""One framework lifecycle module handed to the adoption: adopted, or kept and guarded.

Only the lifecycle names the module defines are replaced (``adopted``); its wrapper class, and
the rest of the module, are left alone (miles' plugin keeps its ``isinstance`` test, which the
package's groups fail, so it passes them to torch as they are), and what the framework's patch
does besides its lifecycle is kept (``jobs``). Where the framework's lifecycle stays, its patch
is guarded (``guard``). A module is handled once per module object; one executed again
(``importlib.reload``) is handled again, and so are the bindings other modules made of it.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from .. import _env
from ..patching import patchset
from . import adopted, guard, jobs
from .seen import SEEN, Adoption
from .switch import report, setting

logger = logging.getLogger("reloadpg_autopatch")

#: Modules whose bindings are never pointed elsewhere.
_NEVER = ("torch", "reloadpg_autopatch")


def _rebind_elsewhere(module: Any, replaced: dict[str, tuple[Any, Any]]) -> list[str]:
    """Point every module global that *is* a replaced function at its replacement."""
    table = {id(old): (old, new) for old, new in replaced.values()}
    never = tuple(p + "." for p in _NEVER)
    changed = []
    for name, other in list(sys.modules.items()):
        if other is module or name in _NEVER or name.startswith(never):
            continue
        namespace = getattr(other, "__dict__", None)
        if type(namespace) is not dict or table.keys().isdisjoint(map(id, namespace.values())):
            continue
        for attribute, value in list(namespace.items()):
            pair = table.get(id(value))
            if pair is not None and pair[0] is value:
                try:
                    setattr(other, attribute, pair[1])
                except Exception as error:  # a read-only or exotic module: say so, go on
                    logger.warning("cannot rebind %s.%s: %s", name, attribute, error)
                    continue
                changed.append(f"{name}.{attribute}")
    return changed


def _adopt(module: Any, elsewhere: bool) -> Adoption:
    ours = adopted.ours()
    replaced: dict[str, tuple[Any, Any]] = {}
    for name in _env.ADOPTED_NAMES:
        current = vars(module).get(name)
        if callable(current):
            replaced[name] = (current, ours[name])
            setattr(module, name, ours[name])
    adoption = Adoption(module.__name__, adopted=tuple(replaced), kept_jobs=jobs.keep(module))
    if elsewhere:
        adoption.rebound = _rebind_elsewhere(module, replaced)
    return adoption


def _put(module: Any) -> dict[str, Any]:
    """What adoption (or the guard) put in the module: executed again, it holds other objects."""
    return {name: vars(module).get(name) for name in _env.ADOPTED_NAMES}


def _still_in_force(module: Any, put: dict[str, Any]) -> bool:
    """Whether ``module`` still holds what was put there (an ``importlib.reload`` executes it
    again in the same module object, binding its own functions afresh)."""
    return all(vars(module).get(name) is value for name, value in put.items())


def _keep(module: Any, why: str, elsewhere: bool) -> Adoption:
    jobs.drop(module)
    adoption = Adoption(module.__name__, kept=why)
    original = vars(module).get("monkey_patch_torch_dist")
    if callable(original) and not guard.is_guarded(original):
        wrapped = guard.guarded(original)
        module.monkey_patch_torch_dist = wrapped
        if elsewhere:
            pair = (original, wrapped)
            adoption.rebound = _rebind_elsewhere(module, {"monkey_patch_torch_dist": pair})
    adoption.guarded = callable(vars(module).get("monkey_patch_torch_dist"))
    if jobs.their_patch_ran(module):
        guard.guard_their_functions()
    return adoption


def handle(module: Any, *, elsewhere: bool = False) -> Adoption | None:
    """Adopt ``module``'s lifecycle, or keep it and guard it; once per module object.

    ``elsewhere``: the module was imported before; bindings other modules made of its
    functions are pointed at what replaced them. None when ``torch.distributed`` is unpatched.
    """
    name = module.__name__
    seen = SEEN.get(name)
    if seen is not None and seen[0] is module:
        if _still_in_force(module, seen[2]):
            return seen[1]
        elsewhere = True  # executed again: what other modules bound of it goes too
        logger.info("%s was executed again: handing it to the adoption again", name)
    if patchset.current() is None:
        return None
    on, problem = setting()
    if problem is not None:
        report(problem)
        adoption = _keep(module, problem, elsewhere)
    elif not on:
        why = f"{_env.ADOPT_ENV}={os.environ.get(_env.ADOPT_ENV, '')!r}"
        adoption = _keep(module, why, elsewhere)
    elif jobs.their_patch_ran(module):
        why = (
            "its own monkey_patch_torch_dist() ran in this process before the module was "
            "adopted (torch.distributed.old_new_group is set): its groups exist, so its own "
            "lifecycle stays"
        )
        adoption = _keep(module, why, elsewhere)
    else:
        adoption = _adopt(module, elsewhere)
    SEEN[name] = (module, adoption, _put(module))
    if adoption.kept is None:
        logger.info(
            "adopted %s: %s now call reloadpg_autopatch's lifecycle",
            name,
            ", ".join(adoption.adopted) or "no lifecycle name",
        )
    else:
        logger.info("%s keeps its own lifecycle: %s", name, adoption.kept)
    return adoption


def on_import(module: Any) -> None:
    """The start-up watcher's callback: ``module`` has just executed."""
    handle(module)
