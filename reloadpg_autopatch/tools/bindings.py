"""Find a package's module-level bindings of ``torch.distributed`` functions by reading its source.

Megatron binds collectives into module globals at import time (``dist_all_gather_func =
torch.distributed.all_gather_into_tensor``, ``from torch.distributed import
_coalescing_manager``), sometimes inside module-level ``if``/``try`` blocks. Reading the source
with ``ast`` finds them without importing anything, so a binding a future release adds is found
the day it appears; ``check`` then imports the modules and tells which ones hold our wrapper.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_DIST = "torch.distributed"
_C10D = "torch.distributed.distributed_c10d"


@dataclass(frozen=True)
class Binding:
    """``module.attribute`` is bound at import time to ``target`` (a dotted torch name)."""

    module: str
    attribute: str
    target: str


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _module_level(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements that run at import time: module body, and inside if/try/with blocks."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.For, ast.While, ast.With)):
            yield from _module_level(node.body)
            yield from _module_level(getattr(node, "orelse", []))
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            yield from _module_level(node.body)
            for handler in node.handlers:
                yield from _module_level(handler.body)
            yield from _module_level(node.orelse)
            yield from _module_level(node.finalbody)


def _bindings_in(module: str, tree: ast.Module) -> list[Binding]:
    aliases: dict[str, str] = {}
    found: dict[str, Binding] = {}
    for node in _module_level(tree.body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                name = alias.asname or alias.name
                if node.module in (_DIST, _C10D):
                    found.setdefault(name, Binding(module, name, full))
                elif full in (_DIST, _C10D):
                    aliases[name] = full
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            dotted = _dotted(node.value)
            if dotted is None:
                continue
            head, _, rest = dotted.partition(".")
            resolved = f"{aliases[head]}.{rest}" if head in aliases and rest else None
            if resolved is None:
                continue
            owner, _, leaf = resolved.rpartition(".")
            if owner not in (_DIST, _C10D):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, Binding(module, target.id, f"{owner}.{leaf}"))
    return list(found.values())


def _files(package: str) -> Iterator[tuple[str, Path]]:
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise ModuleNotFoundError(f"no package named {package!r}")
    roots = list(spec.submodule_search_locations or [])
    if not roots and spec.origin:
        yield package, Path(spec.origin)
        return
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            relative = path.relative_to(root).with_suffix("")
            parts = [p for p in relative.parts if p != "__init__"]
            yield ".".join([package, *parts]), path


def find_bindings(package: str = "megatron.core") -> list[Binding]:
    """Every module-level binding of a ``torch.distributed`` name in ``package``'s source."""
    out: list[Binding] = []
    for module, path in _files(package):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if "torch" not in text or "distributed" not in text:
            continue
        try:
            tree = ast.parse(text, filename=str(path))
        except SyntaxError:
            continue
        out.extend(_bindings_in(module, tree))
    return out


def _torch_object(target: str) -> Any:
    from .. import _originals

    owner, _, name = target.rpartition(".")
    module = importlib.import_module(owner)
    if owner in (_DIST, _C10D) and hasattr(module, name):
        try:
            return _originals.original(name)
        except AttributeError:  # not a callable: a class constant or a module
            return getattr(module, name)
    return getattr(module, name, None)


def takes_group(target: str) -> bool:
    """Whether torch's object behind ``target`` is a callable with a process-group parameter."""
    from ..patching import rule

    return rule.takes_group(_torch_object(target))


def check(bindings: Iterable[Binding]) -> dict[str, list[Binding]]:
    """Import each binding's module and sort group-taking bindings into patched and stale.

    Bindings of names that take no group (``ProcessGroup``, ``DeviceMesh``, ``checkpoint``)
    are ``ignored``: there is nothing to patch in them. A module that fails to import is
    ``unimportable``.
    """
    from ..patching.wrapgen import is_generated

    result: dict[str, list[Binding]] = {
        "patched": [],
        "stale": [],
        "ignored": [],
        "unimportable": [],
    }
    for binding in bindings:
        if not takes_group(binding.target):
            result["ignored"].append(binding)
            continue
        try:
            module = importlib.import_module(binding.module)
        except Exception:
            result["unimportable"].append(binding)
            continue
        value = getattr(module, binding.attribute, None)
        result["patched" if is_generated(value) else "stale"].append(binding)
    return result
