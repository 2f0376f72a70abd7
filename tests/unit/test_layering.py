"""Layers: a second patch layered on top of ours (slime's actor does that), and our own layers'
imports, which run one way, with the environment's vocabulary in a bottom module below them all.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.programs import slime_like
from tests.support.ranks import Rank, run_ranks

pytestmark = pytest.mark.timeout(180)


def _layered(ctx: Rank) -> dict:
    import torch

    import reloadpg_autopatch
    from reloadpg_autopatch.groups import registry

    dist = ctx.patched()
    ours = dist.new_group([0, 1])
    bound_all_gather = dist.all_gather_into_tensor  # a Megatron-style binding of our wrapper
    records_before = len(registry.records())

    slime_class, slime_destroy, slime_reload = slime_like.apply()
    theirs = dist.new_group([0, 1])
    their_sub, _ = dist.new_subgroups(2)  # torch's helper creates through the outer new_group
    out = {
        "their_subgroup_type": type(their_sub).__name__,
        "theirs_type": type(theirs).__name__,
        "inner_type": type(theirs.group).__name__,
        "records_added": len(registry.records()) - records_before,  # not even subgroups
    }

    def gather(func, group):
        buffer = torch.zeros(4)
        func(buffer, torch.full((2,), float(ctx.rank)), group=group)
        return buffer.tolist()

    def total(group):
        t = torch.tensor([ctx.rank + 1.0])
        dist.all_reduce(t, group=group)
        return t.item()

    out["their_group_via_their_patch"] = [
        total(theirs),
        gather(dist.all_gather_into_tensor, theirs),
    ]
    out["their_group_via_our_binding"] = gather(bound_all_gather, theirs)
    try:  # torch's own all_gather_single hands their class to the C++ trampoline
        gather(reloadpg_autopatch._originals.original("all_gather_single"), theirs)
        out["their_group_unpatched"] = "no error"
    except Exception as error:
        out["their_group_unpatched"] = type(error).__name__
    # A binding made before any patch: torch's original delegates to distributed_c10d's
    # all_gather_single by name, which is ours there, so even it works.
    out["their_group_stale_binding"] = gather(
        reloadpg_autopatch._originals.original("all_gather_into_tensor"), theirs
    )
    out["our_group_via_their_patch"] = [total(ours), gather(dist.all_gather_into_tensor, ours)]

    # Each layer destroys and reloads its own groups; neither disturbs the other.
    reloadpg_autopatch.destroy_process_groups()
    out["theirs_alive_while_ours_sleep"] = total(theirs)
    reloadpg_autopatch.reload_process_groups()
    slime_destroy()
    out["ours_alive_while_theirs_sleep"] = total(ours)
    slime_reload()
    out["after_both_reloaded"] = [total(ours), total(theirs), type(theirs.group).__name__]
    out["is_slime_class"] = isinstance(theirs, slime_class)
    return out


def test_outermost_patch_wraps_and_both_layers_keep_working() -> None:
    for report in run_ranks(_layered, 2):
        assert report["theirs_type"] == "SlimeLikeGroup"
        assert report["their_subgroup_type"] == "SlimeLikeGroup"
        assert report["inner_type"] == "ProcessGroup"  # not wrapped twice
        assert report["records_added"] == 0
        assert report["their_group_via_their_patch"] == [3.0, [0.0, 0.0, 1.0, 1.0]]
        assert report["their_group_via_our_binding"] == [0.0, 0.0, 1.0, 1.0]
        assert report["their_group_unpatched"] != "no error"  # their class alone is broken
        assert report["their_group_stale_binding"] == [0.0, 0.0, 1.0, 1.0]
        assert report["our_group_via_their_patch"] == [3.0, [0.0, 0.0, 1.0, 1.0]]
        assert report["theirs_alive_while_ours_sleep"] == 3.0
        assert report["ours_alive_while_theirs_sleep"] == 3.0
        assert report["after_both_reloaded"] == [3.0, 3.0, "ProcessGroup"]
        assert report["is_slime_class"]


# ---- the import layering ---------------------------------------------------------------------

PACKAGE = ROOT / "reloadpg_autopatch"


def _imported_modules(path: Path) -> set[str]:
    """Absolute names of the modules a file imports at run time (``if TYPE_CHECKING:`` aside)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]

    tree = ast.parse(path.read_text(encoding="utf-8"))
    for_type_checkers = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            for_type_checkers.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found = set()
    for node in ast.walk(tree):
        if id(node) in for_type_checkers:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if node.module is None or node.level:
                # "from .. import x" may import the submodule x: count both spellings
                found.update(f"{name}.{alias.name}" for alias in node.names)
            found.add(name)
    return found


@pytest.mark.parametrize("layer", ["patching", "groups"])
def test_no_module_below_the_start_up_layer_imports_from_it(layer: str) -> None:
    offenders = {
        path.name: sorted(
            m for m in _imported_modules(path) if m.startswith(f"{PACKAGE.name}._startup")
        )
        for path in sorted((PACKAGE / layer).rglob("*.py"))
    }
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_the_environment_module_imports_only_os() -> None:
    assert _imported_modules(PACKAGE / "_env.py") <= {"os"}
    # And at run time, in an interpreter that has loaded nothing but the essentials (-S -I).
    source = (
        "import sys; before = set(sys.modules); import reloadpg_autopatch._env; "
        "print(sorted(set(sys.modules) - before))"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-S",
            "-I",
            "-c",
            f"import sys; sys.path.insert(0, {str(PACKAGE.parent)!r}); {source}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    loaded = set(ast.literal_eval(proc.stdout.strip()))
    assert loaded - {"os", "reloadpg_autopatch", "reloadpg_autopatch._env"} == set(), loaded


# ---- the import graph: no cycle of any kind, layers that run one way -------------------------


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


_MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _every_import(path: Path) -> set[str]:
    """The package's modules a file imports in any way: at the top, deferred inside a function,
    or for type checkers only (``if TYPE_CHECKING:``). Each counts for a cycle."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in _MODULES)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name in _MODULES:
                found.add(name)
            found.update(
                f"{name}.{alias.name}" for alias in node.names if f"{name}.{alias.name}" in _MODULES
            )
    found.discard(me)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two modules or more (Tarjan), each a cycle's members."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_the_package_has_no_import_cycle_deferred_and_typing_imports_included() -> None:
    graph = {name: _every_import(path) for name, path in _MODULES.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    # The oracle itself can fail: a cycle through a deferred import is found.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    source = "def f():\n    from . import lifecycle\n"
    tree_names = {n.module for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)}
    assert tree_names == {None}  # ``from . import x`` reaches _every_import as module None


#: The layers, top first: a module may import its own layer and the layers below it only.
LAYERS = (
    ("reloadpg_autopatch.__main__", "reloadpg_autopatch.tools"),
    ("reloadpg_autopatch._startup",),
    ("reloadpg_autopatch.patching",),
    ("reloadpg_autopatch.groups",),
    ("reloadpg_autopatch._env", "reloadpg_autopatch._originals", "reloadpg_autopatch.errors"),
)


def _layer(module: str) -> int | None:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return None  # the package itself: its __init__ imports nothing at the top


def test_imports_run_one_way_and_no_groups_module_imports_patching() -> None:
    upward = []
    for name, path in sorted(_MODULES.items()):
        mine = _layer(name)
        for target in sorted(_every_import(path)):
            theirs = _layer(target)
            if mine is not None and theirs is not None and theirs < mine:
                upward.append(f"{name} -> {target}")
    assert upward == []
    groups = [n for n in _MODULES if n.startswith("reloadpg_autopatch.groups")]
    assert groups, "no groups/ module found: the test reads the wrong tree"
    into_patching = {
        n: sorted(
            t for t in _every_import(_MODULES[n]) if t.startswith("reloadpg_autopatch.patching")
        )
        for n in groups
    }
    assert {n: t for n, t in into_patching.items() if t} == {}
