"""Subclasses of torch's group-taking classes (``P2POp``) that store the native group."""

from __future__ import annotations

import inspect
from typing import Any

import torch.distributed as dist

from ..groups.reloadable import ReloadableProcessGroup
from ..groups.unwrap import unwrap
from .wrapgen import MARKER, generate, is_generated

_Native = dist.ProcessGroup


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
