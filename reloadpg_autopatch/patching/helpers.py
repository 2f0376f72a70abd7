"""torch's group-creating helpers (``new_subgroups*``), re-created to use the current new_group.

torch's ``new_subgroups*`` helpers call ``new_group`` through their module globals, not through
the ``torch.distributed`` namespace, so patching the namespace alone would not reach them: each
helper is re-created from its own code object with a globals mapping that resolves ``new_group``
to the namespace's (ours, or an outer framework's on top of ours) and everything else to
torch's live module dictionary. That keeps torch's own logic (validation, rank partitioning)
instead of a copy of it.
"""

from __future__ import annotations

import dis
import inspect
import logging
import types
from collections.abc import Callable, Mapping
from typing import Any

from .wrapgen import is_generated, mark

logger = logging.getLogger("reloadpg_autopatch")


def _code_objects(code: types.CodeType) -> list[types.CodeType]:
    found = [code]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found.extend(_code_objects(const))
    return found


def _global_names(func: types.FunctionType) -> set[str]:
    return {name for code in _code_objects(func.__code__) for name in code.co_names}


def _writes_globals(func: types.FunctionType) -> bool:
    return any(
        ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL")
        for code in _code_objects(func.__code__)
        for ins in dis.get_instructions(code)
    )


def discover_helpers(snapshot: Mapping[str, Any]) -> list[str]:
    """Namespace functions named ``new_*`` that create groups through ``new_group``.

    Found from their code (transitively: ``new_subgroups`` goes through
    ``new_subgroups_by_enumeration``), so a helper added by a future torch is covered.
    """
    candidates = {
        name: obj
        for name, obj in snapshot.items()
        if name.startswith("new_")
        and name != "new_group"
        and isinstance(obj, types.FunctionType)
        and not is_generated(obj)
    }
    for name, obj in list(candidates.items()):
        if hasattr(obj, "__wrapped__"):  # a decorator's closure holds the code we would clone
            del candidates[name]
            if "new_group" in _global_names(inspect.unwrap(obj)):
                logger.warning(
                    "torch.distributed.%s is decorated, so its new_group calls cannot be "
                    "re-routed: the groups it creates stay native",
                    name,
                )
    helpers: set[str] = set()
    reaches = {"new_group"}
    changed = True
    while changed:
        changed = False
        for name, func in candidates.items():
            if name not in helpers and _global_names(func) & reaches:
                helpers.add(name)
                reaches.add(name)
                changed = True
    safe = []
    for name in sorted(helpers):
        if _writes_globals(candidates[name]):
            logger.warning(
                "torch.distributed.%s writes module globals; its groups stay native", name
            )
        else:
            safe.append(name)
    return safe


class _GlobalsOverlay(dict):
    """Globals for a cloned helper: the other clones, then torch's live module dict.

    ``new_group`` is looked up in the ``torch.distributed`` namespace on every call, so when
    another framework patches it on top of ours, the helpers create its groups too.
    """

    __slots__ = ("base", "namespace")

    def __init__(self, base: dict[str, Any], namespace: Any) -> None:
        super().__init__()
        self["__builtins__"] = base.get("__builtins__", __builtins__)
        self.base = base
        self.namespace = namespace

    def __missing__(self, key: str) -> Any:
        if key == "new_group":
            return self.namespace.new_group
        return self.base[key]


def make_helpers(
    snapshot: Mapping[str, Any], names: list[str], namespace: Any
) -> dict[str, Callable[..., Any]]:
    """Clones of torch's group-creating helpers whose ``new_group`` is the namespace's."""
    overlays: dict[int, _GlobalsOverlay] = {}
    clones: dict[str, Callable[..., Any]] = {}
    for name in names:
        original = snapshot[name]
        base = original.__globals__
        overlay = overlays.setdefault(id(base), _GlobalsOverlay(base, namespace))
        clone = types.FunctionType(
            original.__code__,
            overlay,
            original.__name__,
            original.__defaults__,
            original.__closure__,
        )
        clone.__kwdefaults__ = original.__kwdefaults__
        clones[name] = mark(clone, original)
    for overlay in overlays.values():  # helpers calling helpers (new_subgroups) reach clones
        overlay.update(clones)
    return clones
