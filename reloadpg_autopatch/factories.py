"""Wrappers for the ``torch.distributed`` functions that create or destroy groups.

``new_group`` returns reloadable groups and records every call, member or not, so reload can
replay them in order. torch's ``new_subgroups*`` helpers call ``new_group`` through their module
globals, not through the ``torch.distributed`` namespace, so patching the namespace alone would
not reach them: each helper is re-created from its own code object with a globals mapping that
resolves ``new_group`` to ours and everything else to torch's live module dictionary. That keeps
torch's own logic (validation, rank partitioning) instead of a copy of it.
"""

from __future__ import annotations

import dis
import inspect
import logging
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch.distributed as dist

from . import policy, registry, world
from ._unwrap import unwrap
from ._wrapgen import MARKER, generate, group_params, is_generated, mark, signature_of
from .group import ReloadableProcessGroup

logger = logging.getLogger("reloadpg_autopatch")

_Native = dist.ProcessGroup


def adopt(native: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Record a group creation and wrap the result when this rank is a member."""
    if native is not None and not isinstance(native, int) and type(native) is not _Native:
        logger.debug("leaving %s native: new_group returned a custom class", type(native).__name__)
        return native
    record = registry.current().add(args, kwargs)
    record.native = native
    if type(native) is _Native:
        return ReloadableProcessGroup(native, None, _record=record)
    return native  # NON_GROUP_MEMBER (or None with use_local_synchronization)


def make_new_group(original: Callable[..., Any], namespace: Any) -> Callable[..., Any]:
    """``new_group`` that returns reloadable groups per the wrap policy.

    When another framework has patched ``torch.distributed.new_group`` on top of ours, it owns
    wrapping: we hand it native groups, so nothing is wrapped twice.
    """
    signature = inspect.signature(original)

    def new_group(*args: Any, **kwargs: Any) -> Any:
        native = original(*args, **kwargs)
        if namespace.new_group is not new_group:
            return native  # an outer patch calls us and wraps the result itself
        arguments = signature.bind(*args, **kwargs).arguments
        if not policy.should_wrap(
            arguments.get("ranks"), arguments.get("backend"), world.is_registered()
        ):
            return native
        return adopt(native, args, kwargs)

    return mark(new_group, original)


def make_destroy_process_group(
    original: Callable[..., Any], destroy_native: Callable[[Any], None]
) -> Callable[..., Any]:
    """``destroy_process_group`` that understands reloadable groups.

    Given a reloadable group it releases it for good (reload will not revive it). Given WORLD
    (or nothing) torch destroys every group, so every record is marked destroyed and the WORLD
    registration is dropped: the program has taken WORLD's life in its own hands.
    """
    signature = inspect.signature(original)

    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        try:
            group = signature.bind(*args, **kwargs).arguments.get("group")
        except TypeError:
            return original(*args, **kwargs)  # raises torch's own error
        if isinstance(group, ReloadableProcessGroup):
            registry.current().release(group._record, destroy_native)
            return None
        native = unwrap(group)
        if native is not None and native is not dist.GroupMember.WORLD:
            record = registry.current().record_of(native)
            if record is not None:  # our group, reached through its native handle
                registry.current().release(record, destroy_native)
                return None
            return original(native)
        result = original(native)
        registry.current().forget_natives()
        world.forget()
        return result

    return mark(destroy_process_group, original)


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


def make_class(original: type, group_names: tuple[str, ...]) -> type:
    """A subclass of a group-taking class (``P2POp``) that stores the native group.

    Its ``op`` argument, when it is one of our wrappers (``torch.distributed.isend``), is
    replaced by torch's original, which is what torch compares it with.
    """
    converters = {"op": _original_of}
    namespace: dict[str, Any] = {"__module__": original.__module__, "__doc__": original.__doc__}
    for method_name in ("__new__", "__init__"):
        method = original.__dict__.get(method_name)
        if method is None:
            continue
        method = method.__func__ if isinstance(method, staticmethod) else method
        signature = inspect.signature(method)
        wrapped = generate(
            method,
            signature=signature,
            group_names=group_names,
            converters={k: v for k, v in converters.items() if k in signature.parameters},
            native_type=_Native,
            unwrap=unwrap,
            fast_type=ReloadableProcessGroup,
        )
        namespace[method_name] = staticmethod(wrapped) if method_name == "__new__" else wrapped
    cls = type(original.__name__, (original,), namespace)
    cls.__qualname__ = original.__qualname__
    setattr(cls, MARKER, True)
    return cls


def _original_of(value: Any) -> Any:
    if is_generated(value):
        return value.__wrapped__
    return value


def class_group_params(cls: type) -> tuple[str, ...]:
    """Group parameters of a class's constructor (empty for classes that take no group)."""
    names: list[str] = []
    for method_name in ("__new__", "__init__"):
        method = cls.__dict__.get(method_name)
        if isinstance(method, staticmethod):
            method = method.__func__
        if not isinstance(method, types.FunctionType):
            continue
        signature = signature_of(method)
        if signature is not None:
            names.extend(n for n in group_params(signature) if n not in names)
    return tuple(names)
