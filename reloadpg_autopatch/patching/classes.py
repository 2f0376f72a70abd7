"""torch's classes, taught: subclasses of its group-taking classes (``P2POp``) that store the
native group, and ``ProcessGroup`` copied as a handle once the program holds torch's own groups."""

from __future__ import annotations

import inspect
from typing import Any

import torch.distributed as dist

from ..groups.unwrap import unwrap
from ..groups.ways.wrapper import ReloadableProcessGroup
from . import patchset
from .wrapgen import MARKER, generate

_Native = dist.ProcessGroup


def make_class(original: type, group_names: tuple[str, ...]) -> type:
    """A subclass of a group-taking class (``P2POp``) that stores the native group.

    Its ``op`` argument, when it is one of torch's originals (``isend`` bound before the
    patch), is replaced by our wrapper: torch compares ``op`` with the ``isend`` and ``irecv`` of
    ``distributed_c10d``, and so does Dynamo with ``torch.distributed``'s, which are ours.
    """
    converters = {"op": _wrapper_of}
    namespace: dict[str, Any] = {"__module__": original.__module__, "__doc__": original.__doc__}
    for name in group_names:
        namespace[name] = _live_group(name)
    for method_name in ("__new__", "__init__"):
        method = original.__dict__.get(method_name)
        if method is None:
            continue
        method = method.__func__ if isinstance(method, staticmethod) else method
        signature = inspect.signature(method)
        wrapped = generate(
            method,
            signature=signature,
            # __init__ keeps the group as given (the attribute unwraps it when read); __new__
            # may look at it before any attribute exists.
            group_names=group_names if method_name == "__new__" else (),
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


def _live_group(name: str) -> property:
    """An attribute that keeps the group as given and reads as its native group *now*.

    A ``P2POp`` built before a reload is run after it (``batch_isend_irecv`` reads ``op.group``
    then): it must run on the group's live communicator, and torch's type test for the
    coalescing path (``type(group) is ProcessGroup``) must see a native group, as it does for
    torch's own.
    """
    slot = f"_reloadpg_{name}"

    def fget(self: Any) -> Any:
        group = self.__dict__.get(slot)
        if group is None or type(group) is _Native:
            return group
        if isinstance(group, ReloadableProcessGroup) and (inner := group._fast) is not None:
            return inner
        return unwrap(group)

    def fset(self: Any, value: Any) -> None:
        self.__dict__[slot] = value

    return property(fget, fset, doc=f"The native group of the {name!r} given, as it is now.")


def _wrapper_of(value: Any) -> Any:
    patch = patchset.current()
    pair = patch.by_original_id.get(id(value)) if patch is not None else None
    return pair[1] if pair is not None and pair[0] is value else value


def copy_as_handle() -> None:
    """Make ``copy.copy``/``copy.deepcopy`` of a native group return the group itself.

    When the program holds torch's own groups (in place, suspend), torch's class cannot be
    copied (``cannot pickle ProcessGroup``); behind a wrapper a group is a handle, and copying it
    gives the same group (Megatron deep-copies configs that hold groups). So once a group keeps
    torch's own object, torch's class copies like the wrapper: the patch registers this with
    the lifecycle (``groups.torch_class``), which calls it when it hands out the first such
    group, at its creation or WORLD's registration. Idempotent.
    """
    cls = _Native
    if "__copy__" not in cls.__dict__:
        cls.__copy__ = _same  # type: ignore[attr-defined]
        cls.__deepcopy__ = _same_deep  # type: ignore[attr-defined]


def _same(self: Any) -> Any:
    return self


def _same_deep(self: Any, memo: dict[int, Any]) -> Any:
    return self
