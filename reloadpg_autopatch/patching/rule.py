"""The one rule for "this callable takes a process group", read from torch's own signatures."""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable
from typing import Any

#: Parameter names that hold a process group in torch.distributed's API.
GROUP_PARAM_NAMES = frozenset({"group", "process_group", "pg"})

_EMPTY = inspect.Parameter.empty
_P = inspect.Parameter

# "ProcessGroup", "ProcessGroup | None", "Optional[ProcessGroup]", with or without module paths.
_GROUP_ANNOTATION = re.compile(
    r"^(?:typing\.)?(?:Optional\[)?(?:None \| )?(?:[\w.]+\.)?ProcessGroup(?: \| None)?\]?$"
)


def _is_group_annotation(annotation: object) -> bool:
    if isinstance(annotation, type):
        return annotation.__name__ == "ProcessGroup"
    text = annotation if isinstance(annotation, str) else str(annotation)
    return bool(_GROUP_ANNOTATION.match(text.replace("<class '", "").replace("'>", "")))


def group_params(signature: inspect.Signature) -> tuple[str, ...]:
    """Names of the parameters of ``signature`` that take a single process group.

    A parameter counts when it is annotated as a ``ProcessGroup``, or when it is unannotated
    and named ``group``/``process_group``/``pg`` or ``*_pg`` (``parent_pg``). Integer and
    string companions such as ``group_src`` or ``group_desc`` never match, nor does a ``*_pg``
    annotated as something else (``_create_process_group_wrapper(wrapped_pg: Backend)``).
    """
    found = []
    for param in signature.parameters.values():
        if param.kind in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD):
            continue
        name = param.name
        named = name in GROUP_PARAM_NAMES or name.endswith("_pg")
        annotation = param.annotation
        if _is_group_annotation(annotation) or (named and annotation is _EMPTY):
            found.append(name)
    return tuple(found)


def signature_of(func: Callable[..., Any]) -> inspect.Signature | None:
    """The signature to copy for ``func`` (following ``__wrapped__``), or None if it has none."""
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None


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


def takes_group(obj: Any) -> bool:
    """Whether ``obj`` is a callable (function or class) with a process-group parameter."""
    if obj is None or inspect.ismodule(obj):
        return False
    if isinstance(obj, type):
        return bool(class_group_params(obj))
    if not callable(obj):
        return False
    signature = signature_of(obj)
    return signature is not None and bool(group_params(signature))
