"""Adoption: a framework's lifecycle module, once imported, calls this package's lifecycle.

slime's, miles' and vime's actors bind their lifecycle at import (``from
slime.utils.reloadable_process_group import destroy_process_groups, ...``), exactly as Megatron
binds collectives. When such a module has executed (the start-up watcher calls ``on_import``
before anything can import a name from it), or when the patch finds it already imported
(``adopt_loaded``, which also points the names other modules bound at ours), its lifecycle names
are pointed at this package's own:

- ``monkey_patch_torch_dist()``: a no-op, the patch is active already;
- ``register_default_process_group(timeout)``: the package's, asking nothing of the framework
  (its Gloo group, made before registration, is left alone by WORLD's swap as every group the
  package did not make is: ``groups.world.carry``);
- ``destroy_process_groups()``, ``reload_process_groups()``: the package's.

Only names the module defines are replaced; its wrapper class, and the rest of the module, are
left alone (miles' plugin keeps its ``isinstance`` test, which the package's groups fail, so it
passes them to torch as they are). The framework's own patch then never runs, so its class
never holds a group; what that patch does besides its lifecycle is kept (``_keep_jobs``): the
rewrite of the backend its ``new_group`` applies (slime's accelerator, PR #2216: ``nccl`` to
``mccl`` on MUSA), and ``torch.distributed.old_new_group``, which slime's ``init_gloo_group``
reads. A module executed again (``importlib.reload``) is adopted again.

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
from typing import Any

from .. import _env
from ..groups.ways.wrapper import ReloadableProcessGroup
from . import factories, patchset

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
    #: What adoption kept of the framework's patch besides its lifecycle (adopted only).
    kept_jobs: list[str] = field(default_factory=list)


#: Module name -> (the module object, what was done, ``{name: what was put there}``): a module
#: imported again, or executed again in place, is handled again.
_SEEN: dict[str, tuple[Any, Adoption, dict[str, Any]]] = {}
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


def _ours(module: Any) -> dict[str, Any]:
    # The lifecycle's modules load with the first module adopted, not with the patch (which
    # runs inside ``import torch``), as they load with the first group (``factories``).
    from ..groups import lifecycle

    return {
        "monkey_patch_torch_dist": monkey_patch_torch_dist,
        "register_default_process_group": lifecycle.register_default_process_group,
        "destroy_process_groups": lifecycle.destroy_process_groups,
        "reload_process_groups": lifecycle.reload_process_groups,
    }


# ---- what the framework's patch does besides its lifecycle -----------------------------------


def _backend_rewrite(module: Any) -> tuple[str, Any] | None:
    """slime's ``new_group`` (PR #2216) asks its accelerator for the backend to use where
    ``"nccl"`` is asked for (``mccl`` on MUSA): the same rewrite, from the module's own
    ``accelerator``, and the doctor's words for it. None for a module without one."""
    import torch.distributed as dist

    accelerator = vars(module).get("accelerator")
    choose = getattr(accelerator, "process_group_backend", None)
    if not callable(choose):
        return None
    label = f"{getattr(accelerator, '__name__', module.__name__ + '.accelerator')}."
    label += "process_group_backend"

    def rewrite(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        explicit = args[2] if len(args) > 2 else kwargs.get("backend")
        if explicit is None and not dist.is_initialized():
            return args, kwargs  # torch says what is wrong
        backend = str(explicit) if explicit is not None else str(dist.get_backend())
        if backend != "nccl":
            return args, kwargs
        chosen = choose(backend)
        if chosen == backend:
            return args, kwargs
        if len(args) > 2:
            return (*args[:2], chosen, *args[3:]), kwargs
        return args, {**kwargs, "backend": chosen}

    try:
        now = f" (now {choose('nccl')!r})"
    except Exception as error:  # its accelerator cannot tell yet: say so, rewrite at creation
        now = f" (its accelerator could not tell yet: {error})"
    return f"new_group's backend 'nccl' rewritten by {label}{now}", rewrite


def _old_new_group() -> Any:
    """What ``torch.distributed.old_new_group`` is where adoption sets it: the package's
    ``new_group`` as torch's own modules reach it, the one a framework's patch applied on top of
    the package records (slime's ``init_gloo_group`` makes its Gloo group with it)."""
    patch = patchset.current()
    target = patch.c10d.get("new_group") or patch.wrappers["new_group"]

    def old_new_group(*args: Any, **kwargs: Any) -> Any:
        return target(*args, **kwargs)

    setattr(old_new_group, factories.ADOPTED_DECLARATION, True)
    old_new_group.__doc__ = "torch.distributed.new_group, as it was before the framework's patch"
    return old_new_group


def _keep_jobs(module: Any) -> list[str]:
    """Do what the framework's patch does besides its lifecycle; say what."""
    import torch.distributed as dist

    kept = []
    rewrite = _backend_rewrite(module)
    if rewrite is not None:
        factories.REWRITES[module.__name__] = rewrite[1]
        kept.append(rewrite[0])
    if not callable(vars(module).get("monkey_patch_torch_dist")):
        return kept
    if getattr(dist, factories.SLIME_DECLARATION, None) is None:
        setattr(dist, factories.SLIME_DECLARATION, _old_new_group())
    kept.append(f"torch.distributed.{factories.SLIME_DECLARATION}")
    return kept


# ---- adoption --------------------------------------------------------------------------------


def _their_patch_ran(module: Any) -> bool:
    """Whether a framework's ``monkey_patch_torch_dist`` already patched this process (an
    ``old_new_group`` adoption set says nothing of the kind)."""
    import torch.distributed as dist

    declared = getattr(dist, factories.SLIME_DECLARATION, None)
    if declared is not None and not getattr(declared, factories.ADOPTED_DECLARATION, False):
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
    adoption = Adoption(module.__name__, adopted=tuple(replaced), kept_jobs=_keep_jobs(module))
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
    factories.REWRITES.pop(module.__name__, None)  # its own new_group rewrites, if it runs
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
        if _still_in_force(module, seen[2]):
            return seen[1]
        elsewhere = True  # executed again: what other modules bound of it goes too
        logger.info("%s was executed again: handing it to the adoption again", name)
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
    _SEEN[name] = (module, adoption, _put(module))
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
            for _, adoption, _ in _SEEN.values()
        ],
    }
