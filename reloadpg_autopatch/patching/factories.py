"""Wrappers for the ``torch.distributed`` functions that create or destroy groups.

``new_group`` hands each creation to the group lifecycle, which records it (member or not) so
that reload can replay it, and wraps it per the wrap policy. ``destroy_process_group`` releases
a reloadable group for good, or, given WORLD, ends every group of that world.

Frameworks patch ``torch.distributed.new_group`` on top of ours. A layer that wraps groups
itself (slime's ``monkey_patch_torch_dist`` does, and says so by setting
``torch.distributed.old_new_group``; any layer can say so by setting
``__reloadpg_outer_wraps__ = True`` on its function) owns wrapping: we hand it native groups, so
nothing is wrapped twice, and log once which layer we stepped back for. Any other layer (a
logging or profiling shim that passes the call through) gets our reloadable groups.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from ..groups.ways.wrapper import ReloadableProcessGroup
from . import install, patchset
from .wrapgen import mark


def _lifecycle() -> Any:
    # Imported on the first creation or destroy, not when the patch is applied: the patch runs
    # inside `import torch`, and the lifecycle's modules are not needed before a group exists.
    from ..groups import lifecycle

    return lifecycle


logger = logging.getLogger("reloadpg_autopatch")

_Native = dist.ProcessGroup

#: Set to True on an outer ``new_group`` to declare that it wraps the groups we hand it.
OUTER_WRAPS = "__reloadpg_outer_wraps__"
#: What slime's patch sets on the namespace: the ``new_group`` it wraps.
SLIME_DECLARATION = "old_new_group"
#: Set on the ``old_new_group`` that adoption puts in the namespace for the framework to read
#: (the framework's patch never ran): it declares no outer layer.
ADOPTED_DECLARATION = "__reloadpg_adopted__"


def _label(func: Any) -> str:
    module = getattr(func, "__module__", None) or "?"
    return f"{module}.{getattr(func, '__qualname__', repr(func))}"


def outer_wraps(outer: Any, namespace: Any) -> str | None:
    """Why ``outer`` (the namespace's ``new_group``, not ours) owns wrapping, or None."""
    if getattr(outer, OUTER_WRAPS, False) is True:
        return f"it sets {OUTER_WRAPS}"
    declared = getattr(namespace, SLIME_DECLARATION, None)
    if declared is not None and not getattr(declared, ADOPTED_DECLARATION, False):
        return f"torch.distributed.{SLIME_DECLARATION} is set, as slime's patch sets it"
    return None


def _complete(reason: str) -> None:
    """Collectives must unwrap groups from now on (they stay torch's in native mode)."""
    patch = patchset.current()
    if patch is not None and not patch.complete:
        install.complete(reason)


#: Outer ``new_group`` layers we stepped back for (warned once each in a process).
_WARNED: set[str] = set()

#: What an adopted framework's own ``new_group`` did to its arguments before creating a group
#: (slime's backend rewrite), by the framework module that asked: ``(args, kwargs) -> (args,
#: kwargs)``, applied by the namespace's ``new_group`` as the framework's patch applied it.
REWRITES: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], Any]] = {}


def _rewritten(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    for rewrite in list(REWRITES.values()):
        args, kwargs = rewrite(args, kwargs)
    return args, kwargs


def _note_native(group: Any) -> None:
    from ..groups.world import carry

    carry.note_native(group)


def _step_back(outer: Any, reason: str) -> None:
    label = _label(outer)
    if label in _WARNED:
        return
    _WARNED.add(label)
    logger.warning(
        "torch.distributed.new_group is %s, applied on top of reloadpg_autopatch, and it wraps "
        "the groups it creates (%s): reloadpg_autopatch hands it native groups and leaves "
        "their destroy/reload to it",
        label,
        reason,
    )


def make_new_group(
    original: Callable[..., Any], namespace: Any, *, outermost_check: bool
) -> Callable[..., Any]:
    """``new_group`` that returns reloadable groups per the wrap policy.

    ``outermost_check``: this is the function installed in the namespace, where an outer layer
    may sit on top and own wrapping. The copy in ``distributed_c10d`` is reached by torch's
    own modules directly, with no outer layer in between, so it always wraps.
    """

    def new_group(*args: Any, **kwargs: Any) -> Any:
        if outermost_check:
            if REWRITES:
                args, kwargs = _rewritten(args, kwargs)
            outer = namespace.new_group
            if outer is not new_group:
                reason = outer_wraps(outer, namespace)
                if reason is not None:
                    _step_back(outer, reason)
                    _complete(f"{_label(outer)} wraps groups")
                    _lifecycle().refuse_while_asleep(args, kwargs)
                    return original(*args, **kwargs)
        group = _lifecycle().create(original, args, kwargs)
        if type(group) is ReloadableProcessGroup:
            _complete("a group reloads behind a wrapper")
        elif type(group) is _Native:
            _note_native(group)  # unless a record holds it, a cycle leaves it alone
        return group

    return mark(new_group, original)


def make_destroy_process_group(original: Callable[..., Any]) -> Callable[..., Any]:
    """``destroy_process_group`` that understands reloadable groups.

    Given a reloadable group (or its native handle) it releases it for good: reload will not
    revive it. Given WORLD (or nothing) torch destroys every group, and so does the lifecycle.
    """
    signature = inspect.signature(original)

    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        try:
            group = signature.bind(*args, **kwargs).arguments.get("group")
        except TypeError:
            return original(*args, **kwargs)  # raises torch's own error
        return _lifecycle().destroy_process_group(original, group)

    return mark(destroy_process_group, original)
