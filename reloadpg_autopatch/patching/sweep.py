"""Find and fix module attributes that still hold torch's unpatched functions.

Megatron binds some ``torch.distributed`` functions into its module globals at import time
(``dist_all_gather_func = torch.distributed.all_gather_into_tensor``). When the patch lands
after that import, those names keep the originals. The sweep matches by identity against the
snapshot the patch took, so it only ever replaces an object that *is* one of torch's originals.
The sweep by prefixes never touches torch or this package; torch's own distributed modules,
which bind some originals while ``torch.distributed`` is still importing (DeviceMesh binds
``new_group``), are swept once, when the patch is applied (``rebind_torch``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from .._env import parse_prefixes
from . import patchset

logger = logging.getLogger("reloadpg_autopatch")
_NEVER = ("torch", "reloadpg_autopatch")


class Rebinding(NamedTuple):
    """One module attribute that held a torch original: module name, attribute, our wrapper."""

    module: str
    attribute: str
    function: Callable[..., Any]


def _matcher(prefixes: tuple[str, ...]) -> Callable[[str], bool]:
    """A fast test for 'module name is one of the prefixes or inside one of them'."""
    never = tuple(p + "." for p in _NEVER)
    if "*" in prefixes:
        return lambda name: name not in _NEVER and not name.startswith(never)
    exact = frozenset(prefixes)
    dotted = tuple(p + "." for p in prefixes)
    return lambda name: (name in exact or name.startswith(dotted)) and not name.startswith(never)


def _scan(selected: Callable[[str], bool], fix: bool) -> list[Rebinding]:
    modules = [(name, module) for name, module in list(sys.modules.items()) if selected(name)]
    return _sweep(modules, fix)


def _sweep(modules: Iterable[tuple[str, Any]], fix: bool) -> list[Rebinding]:
    patch = patchset.current()
    if patch is None:
        return []
    table = patch.by_original_id
    ids = table.keys()
    found: list[Rebinding] = []
    for name, module in modules:
        namespace = getattr(module, "__dict__", None)
        if type(namespace) is not dict:
            continue
        if ids.isdisjoint(map(id, namespace.values())):
            continue
        for attribute, value in list(namespace.items()):
            pair = table.get(id(value))
            if pair is None or pair[0] is not value:
                continue
            if fix:
                try:
                    setattr(module, attribute, pair[1])
                except Exception as error:  # a read-only or exotic module: leave it stale
                    logger.warning("cannot rebind %s.%s: %s", name, attribute, error)
                    continue
            found.append(Rebinding(name, attribute, pair[1]))
    return found


#: torch's own modules that may hold bindings of the functions we wrap, taken at import
#: (``device_mesh`` binds ``new_group`` and ``get_process_group_ranks`` before any hook fires).
#: ``distributed_c10d`` is patched by name instead, and the namespace is the patch itself.
_TORCH_PREFIX = "torch.distributed."
_TORCH_SKIP = frozenset({"torch.distributed", "torch.distributed.distributed_c10d"})


def _is_torch_module(name: str) -> bool:
    return name.startswith(_TORCH_PREFIX) and name not in _TORCH_SKIP


def rebind_torch() -> list[Rebinding]:
    """Point torch's own modules' bindings of the originals at our wrappers (patch time)."""
    return _scan(_is_torch_module, fix=True)


def rebind_module(module: Any) -> list[Rebinding]:
    """Rebind one module that just finished importing (the start-up watcher's callback)."""
    changed = _sweep([(module.__name__, module)], fix=True)
    if changed:
        logger.info("rebound %d stale reference(s) in %s", len(changed), module.__name__)
    return changed


def rebind(prefixes: str | Iterable[str] | None = None) -> list[Rebinding]:
    """Point every stale reference in the selected modules at our wrapper; return what changed.

    ``prefixes`` selects modules by package name (``"megatron"`` matches ``megatron`` and
    ``megatron.core.timers``); ``"*"`` selects every module. torch and this package are never
    swept. Returns an empty list when ``torch.distributed`` is not patched.
    """
    return _scan(_matcher(parse_prefixes(prefixes)), fix=True)


def find_stale(prefixes: str | Iterable[str] | None = "*") -> list[Rebinding]:
    """List the references ``rebind`` would change, without changing them."""
    return _scan(_matcher(parse_prefixes(prefixes)), fix=False)
