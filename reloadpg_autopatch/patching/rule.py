"""The one rule for "this callable takes a process group", read from torch's own signatures.

A parameter takes a group when it can receive a ``ProcessGroup``: its annotation is
``ProcessGroup`` (or a subclass), or a union that contains one at any depth (``Optional``,
``ProcessGroup | C10DBackend | None``, ``str | ProcessGroup | None``, ``Annotated[...]``),
written as objects or as strings (``from __future__ import annotations``, forward references).
Strings are read with ``ast`` and their names looked up in the function's module, never
evaluated. An unannotated parameter takes a group when it is named like one (``group``,
``process_group``, ``pg``, ``*_pg``). Containers (``list[ProcessGroup]``) do not count: a
single group never arrives there. The rule reads meaning, not spelling, so a torch release
that re-annotates a parameter changes nothing here.
"""

from __future__ import annotations

import ast
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

#: Parameter names that hold a process group in torch.distributed's API.
GROUP_PARAM_NAMES = frozenset({"group", "process_group", "pg"})

_EMPTY = inspect.Parameter.empty
_P = inspect.Parameter
_UNION_ORIGINS = (typing.Union, types.UnionType)
_MAX_DEPTH = 16


def _process_group_class() -> type:
    import torch.distributed as dist

    return dist.ProcessGroup


def _is_group_class(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, _process_group_class())


def _resolve(node: ast.expr, namespace: Mapping[str, Any]) -> object:
    """The object a ``Name``/``Attribute`` node names in ``namespace``, or None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in namespace:
        return None
    value = namespace[node.id]
    for part in reversed(parts):
        value = getattr(value, part, None)
    return value


def _node_receives_group(node: ast.expr, namespace: Mapping[str, Any], depth: int) -> bool:
    if depth > _MAX_DEPTH:
        return False
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _node_receives_group(node.left, namespace, depth + 1) or _node_receives_group(
            node.right, namespace, depth + 1
        )
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted forward ref
        return _text_receives_group(node.value, namespace, depth + 1)
    if isinstance(node, ast.Subscript):
        head = node.value
        leaf = head.attr if isinstance(head, ast.Attribute) else getattr(head, "id", "")
        if leaf not in ("Optional", "Union", "Annotated"):
            return False  # list[ProcessGroup], Sequence[...]: containers never receive one
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if leaf == "Annotated":
            items = items[:1]
        return any(_node_receives_group(item, namespace, depth + 1) for item in items)
    if isinstance(node, (ast.Name, ast.Attribute)):
        value = _resolve(node, namespace)
        if value is not None:
            return _is_group_class(value)
        leaf = node.attr if isinstance(node, ast.Attribute) else node.id
        return leaf == "ProcessGroup"  # a name only a type checker sees (TYPE_CHECKING import)
    return False


def _text_receives_group(text: str, namespace: Mapping[str, Any], depth: int = 0) -> bool:
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    return _node_receives_group(tree.body, namespace, depth)


def receives_group(annotation: object, namespace: Mapping[str, Any], depth: int = 0) -> bool:
    """Whether a parameter annotated ``annotation`` can receive a single ``ProcessGroup``."""
    if depth > _MAX_DEPTH or annotation is _EMPTY:
        return False
    if isinstance(annotation, str):
        return _text_receives_group(annotation, namespace, depth)
    if isinstance(annotation, typing.ForwardRef):
        return _text_receives_group(annotation.__forward_arg__, namespace, depth)
    if _is_group_class(annotation):
        return True
    origin = typing.get_origin(annotation)
    if origin in _UNION_ORIGINS:
        return any(receives_group(arg, namespace, depth + 1) for arg in typing.get_args(annotation))
    if origin is typing.Annotated:
        return receives_group(typing.get_args(annotation)[0], namespace, depth + 1)
    return False


def _namespace_of(func: object) -> Mapping[str, Any]:
    target = inspect.unwrap(func) if callable(func) else func
    return getattr(target, "__globals__", None) or {}


def group_params(
    signature: inspect.Signature, namespace: Mapping[str, Any] | None = None
) -> tuple[str, ...]:
    """Names of the parameters of ``signature`` that take a single process group.

    ``namespace`` resolves names in string annotations (the function's module globals).
    Integer and string companions such as ``group_src`` or ``group_desc`` never match, nor
    does a ``*_pg`` annotated as something else (``_create_process_group_wrapper(wrapped_pg:
    Backend)``).
    """
    namespace = namespace if namespace is not None else {}
    found = []
    for param in signature.parameters.values():
        if param.kind in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD):
            continue
        name = param.name
        annotation = param.annotation
        if annotation is _EMPTY:
            if name in GROUP_PARAM_NAMES or name.endswith("_pg"):
                found.append(name)
        elif receives_group(annotation, namespace):
            found.append(name)
    return tuple(found)


def signature_of(func: Callable[..., Any]) -> inspect.Signature | None:
    """The signature to copy for ``func`` (following ``__wrapped__``), or None if it has none."""
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None


def function_group_params(func: Callable[..., Any]) -> tuple[str, ...]:
    """Group parameters of a function, its string annotations read in its own module."""
    signature = signature_of(func)
    return group_params(signature, _namespace_of(func)) if signature is not None else ()


def class_group_params(cls: type) -> tuple[str, ...]:
    """Group parameters of a class's constructor (empty for classes that take no group)."""
    names: list[str] = []
    for method_name in ("__new__", "__init__"):
        method = cls.__dict__.get(method_name)
        if isinstance(method, staticmethod):
            method = method.__func__
        if not isinstance(method, types.FunctionType):
            continue
        names.extend(n for n in function_group_params(method) if n not in names)
    return tuple(names)


def takes_group(obj: Any) -> bool:
    """Whether ``obj`` is a callable (function or class) with a process-group parameter."""
    if obj is None or inspect.ismodule(obj):
        return False
    if isinstance(obj, type):
        return bool(class_group_params(obj))
    if not callable(obj):
        return False
    return bool(function_group_params(obj))
