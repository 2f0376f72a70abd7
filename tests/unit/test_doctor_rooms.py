"""The doctor as facts each room reports about itself and one renderer (issue 40): the doctor
reaches a room only through that room's facts; the renderer reads the report alone, never the
interpreter; the JSON keeps the keys it had.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import types

import pytest

from reloadpg_autopatch.tools.doctor import Report, diagnose, render
from tests.support import ROOT

#: None of it needs torch: the doctor answers without it (the start-up lane runs these too).
pytestmark = pytest.mark.startup

DOCTOR = ROOT / "reloadpg_autopatch" / "tools" / "doctor"

#: What the doctor may import from the package besides the rooms' facts: the version, the
#: environment's vocabulary, the site files' names, and the one-line form of a cycle report
#: (shared with the log and the demo).
VOCABULARY = {
    "reloadpg_autopatch",
    "reloadpg_autopatch._env",
    "reloadpg_autopatch._startup.pth",
    "reloadpg_autopatch.groups.report",
}


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _package_imports(source: str, package: str) -> set[str]:
    """The package's modules a module of ``package`` imports, at the top or deferred
    (``from x import y`` counts ``x.y`` where ``y`` is a module, else ``x``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("reloadpg_autopatch"))
        elif isinstance(node, ast.ImportFrom):
            name = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            if not name.startswith("reloadpg_autopatch"):
                continue
            for alias in node.names:
                inner = f"{name}.{alias.name}"
                found.add(inner if _is_module(inner) else name)
    return found


def _past_the_facts(imported: set[str]) -> list[str]:
    """What of ``imported`` is neither the doctor's own, nor a room's facts, nor vocabulary."""
    own = "reloadpg_autopatch.tools.doctor"
    return sorted(
        name
        for name in imported
        if not (name == own or name.startswith(own + "."))
        and name.rpartition(".")[2] != "facts"
        and name not in VOCABULARY
    )


def test_the_doctor_reaches_each_room_only_through_its_facts() -> None:
    modules = sorted(DOCTOR.glob("*.py"))
    assert {p.name for p in modules} >= {"gather.py", "renderer.py"}, "wrong tree?"
    package = "reloadpg_autopatch.tools.doctor"
    reached = {
        p.name: _past_the_facts(_package_imports(p.read_text(encoding="utf-8"), package))
        for p in modules
    }
    assert {name: mods for name, mods in reached.items() if mods} == {}


def test_the_facts_finder_finds_a_reach_past_the_facts() -> None:
    # The oracle can fail: a room's module imported at the top or deferred is found, whatever
    # the spelling; the rooms' facts and the doctor's own modules are not.
    source = (
        "from ...groups import facts, lifecycle\n"
        "from . import implementations\n"
        "import reloadpg_autopatch.groups.mode\n"
        "def f():\n"
        "    from ...patching.patchset import current\n"
        "    from ...groups.world import facts as world\n"
    )
    imported = _package_imports(source, "reloadpg_autopatch.tools.doctor")
    assert _past_the_facts(imported) == [
        "reloadpg_autopatch.groups.lifecycle",
        "reloadpg_autopatch.groups.mode",
        "reloadpg_autopatch.patching.patchset",
    ]


def _full_report() -> Report:
    """A report with every section filled, as a live, patched process would give it."""
    return Report(
        python="3.11.7",
        executable="/venv/bin/python",
        site_dirs=["/venv/site-packages"],
        copies=[
            {
                "path": "/venv/site-packages",
                "pth": True,
                "site": True,
                "runs": True,
                "on_sys_path": True,
            },
        ],
        pth={"installed": True, "path": "/venv/site-packages/x.pth", "current": True},
        start={"installed": False},
        gate={"variable": "SLIME_RELOADABLE_PG", "value": "1", "verdict": "on"},
        options={"SLIME_RELOADABLE_PG_MODE": "suspend", "SLIME_RELOADABLE_PG_LOG": None},
        torch={"version": "2.13.0", "patched": True, "patched_functions": ["all_reduce"]},
        forwarding={"methods": ["allreduce"], "properties": ["group_name"], "inherited": []},
        fidelity={
            "mode": {"mode": "suspend", "variable": "suspend", "backends": {"gloo": "awake"}},
            "nccl": {
                "variable": "TORCH_DIST_USE_NCCL2",
                "value": None,
                "default": "classic",
                "nccl_available": False,
                "resolves_to": "classic",
                "how": "not registered yet",
                "world": [
                    {"device": "cpu", "class": "ProcessGroupGloo", "name": "gloo"}
                    | {"implementation": "gloo"}
                ],
            },
            "suspend": {
                "torch": "2.13.0",
                "available": True,
                "guard": "wrapper",
                "nccl_build": None,
                "nccl_runtime": None,
                "warnings": ["a warning"],
                "resident_always": "what stays",
                "auto": None,
            },
            "c10d": {"installed": 46, "namespace_only": [], "displaced": []},
            "compile": {"loaded": False, "waiting": True},
            "groups": {"reloadable": 1, "aliases": 5, "inconsistent": []},
        },
        cycle={
            "guard": {"min_free_gb": 3.0, "every_call": False, "probe": "torch"},
            "hooks": [],
            "releases": "none found",
            "last": None,
        },
        adoption={
            "variable": None,
            "on": True,
            "problem": None,
            "modules": ["slime.utils.reloadable_process_group"],
            "seen": [],
            "callers": {},
        },
        left_alone=[
            {"name": "1", "ranks": [0], "backend": "gloo", "why": "made elsewhere", "memory": None}
        ],
        notes=["a note"],
        problems=[],
        loaded_modules=1234,
    )


def test_the_renderer_reads_the_report_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same report renders the same text whatever the interpreter did since: another
    module loaded, the variables changed (before: the count of loaded modules was read from
    ``sys.modules`` while rendering)."""
    report = _full_report()
    first = render(report)
    assert "stale refs   none in 1234 loaded modules" in first, first
    assert "left alone   '1' (ranks [0], gloo): made elsewhere" in first, first
    monkeypatch.setitem(sys.modules, "a_module_loaded_later", types.ModuleType("later"))
    monkeypatch.setenv("SLIME_RELOADABLE_PG", "0")
    monkeypatch.setenv("SLIME_RELOADABLE_PG_MODE", "wrapper")
    assert render(report) == first


#: The JSON's keys (``--json``), as they were before the doctor was split.
JSON_KEYS = [
    "version",
    "python",
    "executable",
    "site_processing",
    "site_dirs",
    "pth",
    "start",
    "copies",
    "gate",
    "options",
    "activation",
    "imports",
    "torch",
    "stale",
    "forwarding",
    "fidelity",
    "cycle",
    "adoption",
    "left_alone",
    "notes",
    "problems",
    "verdict",
]


def test_the_json_keeps_its_keys_and_the_exit_code_follows_the_problems() -> None:
    report = diagnose()
    data = report.to_dict()
    assert list(data) == JSON_KEYS
    assert data["verdict"] == report.verdict
    assert report.exit_code == (1 if report.problems else 0)
    report.problems.append("a problem")
    assert (report.exit_code, report.verdict) == (1, "problems found")


#: A value each variable beside the gate does not accept, and what the package does instead.
BAD_VALUES = {
    "SLIME_RELOADABLE_PG_LOG": ("loud", "logging stays at its default"),
    "SLIME_RELOADABLE_PG_REBIND": ("a b", "use dotted names"),
    "SLIME_RELOADABLE_PG_MODE": ("fastest", "wrapper is used"),
    "SLIME_RELOADABLE_PG_MIN_FREE_GB": ("x", "the guard uses its default, 3 GiB"),
    "SLIME_RELOADABLE_PG_SUSPEND_MIN_FREED": ("2", "auto mode uses the default, 0.5"),
    "SLIME_RELOADABLE_PG_MEMORY_GUARD_EVERY_CALL": ("perhaps", "(off)"),
    "SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT": ("-3", "the watchdog uses WORLD's timeout"),
    "SLIME_RELOADABLE_PG_INJECT_FAILURE": ("bogus", "injects nothing"),
}


@pytest.mark.parametrize("variable", sorted(BAD_VALUES))
def test_the_start_up_room_names_each_value_it_does_not_accept(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    from reloadpg_autopatch._startup import facts

    for name in BAD_VALUES:
        monkeypatch.delenv(name, raising=False)
    assert facts.options()[1] == []
    value, instead = BAD_VALUES[variable]
    monkeypatch.setenv(variable, value)
    options, problems = facts.options()
    assert options[variable] == value
    (problem,) = problems
    assert variable in problem, problem
    assert instead in problem, problem


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="the suspend room's facts come from the lifecycle, which needs torch",
)
def test_in_auto_mode_the_doctor_says_what_it_frees_instead_of_suspending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/doctor.md: in ``auto`` mode the mode's lines also say what it frees instead of
    suspending, one-rank groups and groups below ``SLIME_RELOADABLE_PG_SUSPEND_MIN_FREED``
    (its value as read); no such line in ``wrapper`` mode."""
    monkeypatch.setenv("SLIME_RELOADABLE_PG_SUSPEND_MIN_FREED", "0.3")
    monkeypatch.setenv("SLIME_RELOADABLE_PG_MODE", "auto")
    lines = [line.strip() for line in render(diagnose()).splitlines()]
    (auto,) = [line for line in lines if line.startswith("auto:")]
    assert "one-rank groups are freed and made again, never suspended" in auto, auto
    assert "less than 30% of its memory (SLIME_RELOADABLE_PG_SUSPEND_MIN_FREED)" in auto, auto
    monkeypatch.setenv("SLIME_RELOADABLE_PG_MODE", "wrapper")
    lines = [line.strip() for line in render(diagnose()).splitlines()]
    assert not [line for line in lines if line.startswith("auto:")], lines
