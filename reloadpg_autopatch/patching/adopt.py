"""Adoption: a framework's lifecycle module, once imported, calls this package's lifecycle.

slime's, miles' and vime's actors bind their lifecycle at import (``from
slime.utils.reloadable_process_group import destroy_process_groups, ...``), exactly as Megatron
binds collectives. When such a module has executed (the start-up watcher calls ``on_import``
before anything can import a name from it), or when the patch finds it already imported
(``adopt_loaded``, which also points the names other modules bound at ours), its lifecycle names
are pointed at this package's own:

- ``monkey_patch_torch_dist()``: a no-op, the patch is active already;
- ``register_default_process_group(timeout)``: the package's; where the module serves a
  canonical Gloo group (slime's ``get_gloo_group``/``set_gloo_group``) and WORLD is swapped on
  destroy, that group is re-made reloadable, because the swap ends every group torch knows;
- ``destroy_process_groups()``, ``reload_process_groups()``: the package's.

Only names the module defines are replaced; its wrapper class, and the rest of the module, are
left alone (miles' plugin keeps its ``isinstance`` test, which the package's groups fail, so it
passes them to torch as they are). The framework's own patch then never runs, so its class
never holds a group.

With adoption off (``SLIME_RELOADABLE_PG_ADOPT=0``, a bad value, or the framework's patch ran
already), the framework's lifecycle stays, layered on the package's patch as before; its
``monkey_patch_torch_dist`` is wrapped so that, once it has replaced ``torch.distributed``'s
functions, each of those is put behind a guard that unwraps the framework's wrapper first: one
whose ``.group`` is None is refused with ``GroupDestroyedError`` naming the group and the call,
where the framework's own function would hand torch ``None`` (read as WORLD).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from .. import _env
from ..groups.ways.wrapper import ReloadableProcessGroup
from . import patchset

logger = logging.getLogger("reloadpg_autopatch")

#: Set on a framework's ``monkey_patch_torch_dist`` that this module wrapped with the guard.
GUARDED = "__reloadpg_guarded__"
_NEVER = ("torch", "reloadpg_autopatch")


@dataclass
class Adoption:
    """What became of one framework lifecycle module in this process."""

    module: str
    #: The names now pointing at this package's lifecycle (empty when kept).
    adopted: tuple[str, ...] = ()
    #: Why the framework's own lifecycle stays, or None when adopted.
    kept: str | None = None
    #: ``module.attribute`` bindings elsewhere, made before adoption, pointed at ours too.
    rebound: list[str] = field(default_factory=list)
    #: The framework's ``monkey_patch_torch_dist`` refuses its destroyed groups (kept only).
    guarded: bool = False
    #: The canonical Gloo group was re-made reloadable at WORLD's registration.
    gloo_group_kept: bool = False


#: Module name -> (the module object, what was done): a module imported again is seen again.
_SEEN: dict[str, tuple[Any, Adoption]] = {}
_REPORTED: set[str] = set()


# ---- the switch ------------------------------------------------------------------------------


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


def _report(problem: str) -> None:
    if problem in _REPORTED or _gate_reported():
        return
    _REPORTED.add(problem)
    logger.warning("%s", problem)


# ---- the adopted lifecycle -------------------------------------------------------------------


def monkey_patch_torch_dist() -> None:
    """A framework's ``monkey_patch_torch_dist``, adopted: the patch is already active."""


def _registration_for(module: Any) -> Any:
    """The package's ``register_default_process_group``, keeping the module's Gloo group."""
    from ..groups import lifecycle as world

    get_gloo = vars(module).get("get_gloo_group")
    set_gloo = vars(module).get("set_gloo_group")
    if not (callable(get_gloo) and callable(set_gloo)):
        return world.register_default_process_group

    @functools.wraps(world.register_default_process_group)
    def register_default_process_group(
        timeout: timedelta | None = None,
        *,
        accelerator_backends: Any = None,
        temporary_backend: str = "gloo",
    ) -> None:
        world.register_default_process_group(
            timeout,
            accelerator_backends=accelerator_backends,
            temporary_backend=temporary_backend,
        )
        _keep_gloo_group(module.__name__, get_gloo, set_gloo)

    return register_default_process_group


def _keep_gloo_group(name: str, get_gloo: Any, set_gloo: Any) -> None:
    """A canonical Gloo group made before registration dies with WORLD's swap: remake it.

    slime makes its Gloo group right after ``init_process_group``, before registering WORLD,
    and uses it after each reload. Destroying an accelerator WORLD tears down every group torch
    knows, so the package's swap would leave slime a dead group (slime's own lifecycle makes a
    new one at each reload). Made now, after registration, the group is reloadable: one object
    that comes back with every reload, as asleep as the others between a destroy and a reload.
    Every rank registers at the same point of its program, so every rank creates it.
    """
    import torch.distributed as dist

    from ..groups.world import registration as world

    if not world.needs_swap():
        return  # WORLD is not torn down: a raw group made before registration survives
    current = get_gloo()
    if current is None or isinstance(current, ReloadableProcessGroup):
        return
    set_gloo(dist.new_group(backend="gloo"))
    seen = _SEEN.get(name)
    if seen is not None:
        seen[1].gloo_group_kept = True
    logger.info("%s: its Gloo group is reloadable now, as WORLD is swapped on destroy", name)


def _ours(module: Any) -> dict[str, Any]:
    # The lifecycle's modules load with the first module adopted, not with the patch (which
    # runs inside ``import torch``), as they load with the first group (``factories``).
    from ..groups import lifecycle

    return {
        "monkey_patch_torch_dist": monkey_patch_torch_dist,
        "register_default_process_group": _registration_for(module),
        "destroy_process_groups": lifecycle.destroy_process_groups,
        "reload_process_groups": lifecycle.reload_process_groups,
    }


# ---- adoption --------------------------------------------------------------------------------


def _their_patch_ran(module: Any) -> bool:
    """Whether a framework's ``monkey_patch_torch_dist`` already patched this process."""
    import torch.distributed as dist

    if getattr(dist, "old_new_group", None) is not None:
        return True
    recorded = vars(module).get("old_new_group_dict")
    return isinstance(recorded, dict) and os.getpid() in recorded


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
    ours = _ours(module)
    replaced: dict[str, tuple[Any, Any]] = {}
    for name in _env.ADOPTED_NAMES:
        current = vars(module).get(name)
        if callable(current):
            replaced[name] = (current, ours[name])
            setattr(module, name, ours[name])
    adoption = Adoption(module.__name__, adopted=tuple(replaced))
    if elsewhere:
        adoption.rebound = _rebind_elsewhere(module, replaced)
    return adoption


def _keep(module: Any, why: str, elsewhere: bool) -> Adoption:
    adoption = Adoption(module.__name__, kept=why)
    original = vars(module).get("monkey_patch_torch_dist")
    if callable(original) and not getattr(original, GUARDED, False):

        @functools.wraps(original)
        def guarded_monkey_patch_torch_dist(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            guard_their_functions()
            return result

        setattr(guarded_monkey_patch_torch_dist, GUARDED, True)
        module.monkey_patch_torch_dist = guarded_monkey_patch_torch_dist
        if elsewhere:
            pair = (original, guarded_monkey_patch_torch_dist)
            adoption.rebound = _rebind_elsewhere(module, {"monkey_patch_torch_dist": pair})
    adoption.guarded = callable(vars(module).get("monkey_patch_torch_dist"))
    if _their_patch_ran(module):
        guard_their_functions()
    return adoption


def handle(module: Any, *, elsewhere: bool = False) -> Adoption | None:
    """Adopt ``module``'s lifecycle, or keep it and guard it; once per module object.

    ``elsewhere``: the module was imported before; bindings other modules made of its
    functions are pointed at what replaced them. None when ``torch.distributed`` is unpatched.
    """
    name = module.__name__
    seen = _SEEN.get(name)
    if seen is not None and seen[0] is module:
        return seen[1]
    if patchset.current() is None:
        return None
    on, problem = setting()
    if problem is not None:
        _report(problem)
        adoption = _keep(module, problem, elsewhere)
    elif not on:
        why = f"{_env.ADOPT_ENV}={os.environ.get(_env.ADOPT_ENV, '')!r}"
        adoption = _keep(module, why, elsewhere)
    elif _their_patch_ran(module):
        why = (
            "its own monkey_patch_torch_dist() ran in this process before the module was "
            "adopted (torch.distributed.old_new_group is set): its groups exist, so its own "
            "lifecycle stays"
        )
        adoption = _keep(module, why, elsewhere)
    else:
        adoption = _adopt(module, elsewhere)
    _SEEN[name] = (module, adoption)
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


def adopt_loaded() -> list[Adoption]:
    """Adopt the lifecycle modules already imported (the patch calls this when it lands)."""
    done = []
    for name in modules():
        module = sys.modules.get(name)
        spec = getattr(module, "__spec__", None)
        if module is None or getattr(spec, "_initializing", False):
            continue  # not imported, or mid-import: the watcher sees it when it is done
        adoption = handle(module, elsewhere=True)
        if adoption is not None:
            done.append(adoption)
    return done


# ---- the guard over a framework's own patch --------------------------------------------------


def guard_their_functions() -> list[str]:
    """Put each ``torch.distributed`` function a framework replaced behind our unwrapping.

    The framework's function swaps its wrapper for ``.group`` with no None check; the guard,
    generated with torch's signature, unwraps first (the framework's wrapper included), so a
    destroyed one is refused and a live one reaches the framework's function as a native group.
    """
    import torch.distributed as dist

    from .. import _originals
    from ..groups.unwrap import failed, failed_native, unwrap
    from .rule import function_group_params
    from .wrapgen import generate, is_generated

    patch = patchset.current()
    if patch is None:
        return []
    # torch's own functions, where torch defines them: the frameworks patch the namespace only,
    # and a patch applied after theirs took their functions for the namespace's originals.
    defined = _originals.snapshot()["c10d"]
    done = []
    with patchset.LOCK:
        for name, current in list(vars(dist).items()):
            original = defined.get(name)
            if original is None or isinstance(original, type) or name in patch.lifecycle:
                continue
            if current is original or current is patch.wrappers.get(name):
                continue
            if not callable(current) or is_generated(current):
                continue
            params = function_group_params(original)
            if not params:
                continue
            guard = generate(
                original,
                target=current,
                group_names=params,
                native_type=dist.ProcessGroup,
                unwrap=unwrap,
                fast_type=ReloadableProcessGroup,
                on_error=failed,
                on_native_error=failed_native,
            )
            setattr(dist, name, guard)
            done.append(name)
    if done:
        logger.info(
            "put %d functions a framework's patch replaced behind the guard: %s",
            len(done),
            ", ".join(sorted(done)),
        )
    return done


# ---- what the doctor shows -------------------------------------------------------------------


def status() -> dict[str, Any]:
    """The switch, the modules watched, and what became of each one imported here."""
    on, problem = setting()
    return {
        "variable": os.environ.get(_env.ADOPT_ENV),
        "on": on,
        "problem": problem,
        "modules": list(modules()),
        "seen": [
            {**asdict(adoption), "adopted": list(adoption.adopted)}
            for _, adoption in _SEEN.values()
        ],
    }
