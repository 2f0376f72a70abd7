"""Subclasses of torch's group-taking classes (``P2POp``) that store the native group."""

from __future__ import annotations

import inspect
from typing import Any

import torch.distributed as dist

from ..groups.reloadable import ReloadableProcessGroup
from ..groups.unwrap import unwrap
from . import state
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


def _wrapper_of(value: Any) -> Any:
    patch = state.current()
    pair = patch.by_original_id.get(id(value)) if patch is not None else None
    return pair[1] if pair is not None and pair[0] is value else value
