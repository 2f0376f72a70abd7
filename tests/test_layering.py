"""Layers: a second patch layered on top of ours (slime's actor does that), and our own layers'
imports, which run one way, with the environment's vocabulary in a bottom module below them all.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests._ranks import Rank, run_ranks
from tests.programs import slime_like

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

PACKAGE = Path(__file__).resolve().parent.parent / "reloadpg_autopatch"


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
