"""Our own layers' imports, which run one way, with the environment's vocabulary in a bottom
module below them all; inside ``groups/``, the lifecycle's own layers (the drivers above WORLD,
WORLD above the ways, the ways above the bookkeeping), no WORLD branch outside ``groups/world``,
and each part of the process holder written by its one module.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.timeout(180)


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


@pytest.mark.parametrize("layer", ["adoption", "patching", "groups"])
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
#: Adoption sits above the patch: it uses the patch's guard generation and ``new_group`` and the
#: lifecycle, and the start-up layer hands it the frameworks' modules.
LAYERS = (
    ("reloadpg_autopatch.__main__", "reloadpg_autopatch.tools"),
    ("reloadpg_autopatch._startup",),
    ("reloadpg_autopatch.adoption",),
    ("reloadpg_autopatch.patching",),
    ("reloadpg_autopatch.groups",),
    ("reloadpg_autopatch._env", "reloadpg_autopatch._originals", "reloadpg_autopatch.errors"),
)


def _layer(module: str) -> int | None:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return None  # the package itself: its __init__ imports nothing at the top


def test_every_module_but_the_package_itself_sits_in_a_layer() -> None:
    """A room ``LAYERS`` does not name would escape the one-way rule below."""
    assert [name for name in sorted(_MODULES) if _layer(name) is None] == [PACKAGE.name]


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


# ---- inside groups/: the lifecycle's layers, WORLD in its own folder, one writer per part ----

GROUPS = "reloadpg_autopatch.groups"

#: The lifecycle's layers, top first: the facade (and its facts for the doctor, which read the
#: whole lifecycle); the drivers and the steps on one group; WORLD (its registration, swap, end
#: and ways); the ways; the cycle's machinery; below them every piece of bookkeeping (any
#: groups/ module not named here).
GROUP_LAYERS = (
    ("lifecycle", "facts"),
    ("creation", "destroy", "reload", "release", "unwrap"),
    ("world",),
    ("ways",),
    ("recreation", "preflight", "runs"),
    ("agreement",),
)


def _group_layer(module: str) -> int:
    tail = module.removeprefix(GROUPS + ".")
    for rank, prefixes in enumerate(GROUP_LAYERS):
        if any(tail == p or tail.startswith(p + ".") for p in prefixes):
            return rank
    return len(GROUP_LAYERS)


def _groups_modules() -> dict[str, Path]:
    return {n: p for n, p in _MODULES.items() if n.startswith(GROUPS + ".")}


def test_the_lifecycles_layers_run_one_way() -> None:
    modules = _groups_modules()
    assert any(n.startswith(f"{GROUPS}.ways.") for n in modules), "no ways/: wrong tree?"
    assert any(n.startswith(f"{GROUPS}.world.") for n in modules), "no world/: wrong tree?"
    upward = [
        f"{name} -> {target}"
        for name, path in sorted(modules.items())
        for target in sorted(_every_import(path))
        if target.startswith(GROUPS + ".") and _group_layer(target) < _group_layer(name)
    ]
    assert upward == []


#: What says a branch special-cases WORLD: its name, torch's default group, the registration,
#: WORLD's ways (``WorldSwap`` ...) and their module, and WORLD's facts by every name they had
#: or have (whether it swaps, was restored, tears every group down; its native group).
_WORLD_WORDS = re.compile(
    r"\bWORLD\b|is_world|default_pg|_get_default_group|default_group|stand_in|registr"
    r"|\bWorld[A-Z]\w*|world_ways|world\.ways|world_swaps|world_restored|needs_swap"
    r"|swaps_next|destroys_every_group|native_world|end_world"
)


def _branch_tests(tree: ast.AST) -> list[ast.expr]:
    tests: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            tests.append(node.test)
        elif isinstance(node, ast.comprehension):
            tests.extend(node.ifs)
        elif isinstance(node, ast.BoolOp):
            tests.extend(node.values)
    return tests


def _world_branches(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for test in _branch_tests(tree):
        source = ast.unparse(test)
        if _WORLD_WORDS.search(source):
            found.append(f"{path.name}:{test.lineno}: {source}")
    return found


def test_no_module_outside_groups_world_has_a_world_branch() -> None:
    """Not in the lifecycle, nor in the patching: WORLD's facts are asked of ``groups/world``."""
    outside = [p for n, p in _groups_modules().items() if not n.startswith(f"{GROUPS}.world")]
    outside += sorted((PACKAGE / "patching").rglob("*.py"))
    assert [b for path in outside for b in _world_branches(path)] == []


def test_the_world_branch_finder_finds_one(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    for test in (
        "record.is_world",
        "isinstance(record.way, world_ways.WorldSwap)",
        "group is dist.GroupMember.WORLD",
        "holder.world.registration is not None",
        "world_swaps",
        "facts.world_restored",
        "native is not lifecycle.native_world()",
        "needs_swap()",
    ):
        sample.write_text(f"def f(record):\n    if {test}:\n        return 1\n")
        assert _world_branches(sample) == [f"sample.py:2: {test}"]


#: Each part of the process holder and the one module (or package) that writes it.
WRITERS = {
    "rounds": ("store.channel",),
    "records": ("registry",),
    "pools": ("pools",),
    "world": ("world",),
    "ways": ("ways", "world"),
    # the cycle and its phase: the holder's own fields
    "phase": ("stepping",),
    "cycle": ("stepping",),
    "attempt": ("stepping",),
    "step": ("stepping",),
    "step_thread": ("stepping",),
    "last_report": ("stepping",),
    "lost": ("stepping",),
    "worlds_ended": ("stepping",),
}


#: The holder's parts that are objects of their own (the others are the holder's fields).
_PARTS = ("rounds", "records", "pools", "world", "ways")
#: Calls that change the container they are called on.
_MUTATORS = {"add", "append", "insert", "pop", "clear", "update", "remove", "discard", "extend"}


def _holder_chain(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """The holder's part an expression reaches (``holder.records.all``, ``held.index``, ...)."""
    chain = []
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute):
            chain.insert(0, node.attr)
        node = node.value
    base = None
    if isinstance(node, ast.Name):
        if node.id in aliases:
            return aliases[node.id]
        base = node.id
    elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("current"):
        base = "holder"  # process.current().X
    if base is None or not chain:
        return None
    if chain[0] in _PARTS and (len(chain) >= 2 or chain[0] == "ways"):
        return chain[0]
    if len(chain) == 1 and base in ("holder", "self", "fresh") and chain[0] in WRITERS:
        return chain[0]
    return None


def _written_parts(path: Path) -> set[str]:
    """The holder's parts a file changes: ``holder.cycle = ...``, ``holder.records.x = ...``,
    ``held.x[k] = ...`` or ``held.x.add(...)`` of a part fetched first (``held = holder.records``),
    and ``process.current().x = ...``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases = {
        target.id: node.value.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr in _PARTS
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    changed: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                changed.extend(target.elts if isinstance(target, ast.Tuple) else [target])
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            changed.append(node.target)
        elif isinstance(node, ast.Delete):
            changed.extend(node.targets)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _MUTATORS
        ):
            changed.append(node.func.value)
    written = set()
    for target in changed:
        if isinstance(target, ast.Name):
            continue  # a local name rebound, not a part changed
        part = _holder_chain(target, aliases)
        if part is not None:
            written.add(part)
    return written


def test_each_part_of_the_process_holder_is_written_by_its_one_module() -> None:
    """``process`` itself makes the holder and its parts (their first values, a forked child's
    fresh holder); after that each part changes only in its writer."""
    wrong = []
    for name, path in sorted(_groups_modules().items()):
        tail = name.removeprefix(GROUPS + ".")
        if tail == "process":
            continue
        for part in _written_parts(path):
            owners = WRITERS[part]
            if not any(tail == o or tail.startswith(o + ".") for o in owners):
                wrong.append(f"{tail} writes {part} (its writer: {', '.join(owners)})")
    assert wrong == []


def test_the_writer_finder_finds_each_kind_of_write(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f(holder):\n"
        "    holder.cycle = 2\n"
        "    held = holder.pools\n"
        "    held.handed = {}\n"
        "    holder.lock.acquire()\n"
        "    return held.handed.get(1)\n"
    )
    assert _written_parts(sample) == {"cycle", "pools"}
    for line, part in (
        ("holder.records.all = []", "records"),
        ("holder.records.index[0] = None", "records"),
        ("holder.ways['x'] = set()", "ways"),
        ("process.current().cycle += 1", "cycle"),
        ("process.current().rounds.token = 't'", "rounds"),
        ("holder.world.registration = None", "world"),
        ("del holder.records.all[0]", "records"),
    ):
        sample.write_text(f"def f(holder):\n    {line}\n")
        assert _written_parts(sample) == {part}, line


def test_the_bottom_modules_import_what_they_say() -> None:
    """``errors`` imports nothing; the store protocol (``store``'s rounds, entries, a stalled
    round and the sweep) no torch."""
    assert _imported_modules(PACKAGE / "errors.py") == set()
    for name in ("rounds.py", "entries.py", "stalled.py", "sweep.py"):
        found = _imported_modules(PACKAGE / "groups" / "store" / name)
        assert not {m for m in found if m.split(".")[0] == "torch"}, (name, found)
