"""The boot module (``_reloadpg_autopatch_boot``): what start-up imports where the gate is on.

It holds the few names start-up needs of ``_env`` written out, so that start-up imports no
module of the package; these tests keep the two equal, and check which path a process takes.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import _reloadpg_autopatch_boot as boot
import reloadpg_autopatch
from reloadpg_autopatch import _env
from tests.support.venv import clean_env

pytestmark = [pytest.mark.startup, pytest.mark.timeout(60)]


def test_the_start_up_names_are_the_environment_modules() -> None:
    assert boot.GATE == _env.GATE
    assert boot.ON_VALUES == _env.ON_VALUES
    assert boot.ADOPT_MODULES == _env.ADOPT_MODULES
    assert reloadpg_autopatch.__name__ == boot.PACKAGE
    # Every other variable of ours is found by its prefix (``_needs_checks``).
    assert all(v.startswith(boot.GATE + "_") for v in _env.VARIABLES if v != _env.GATE)


def test_the_boot_module_imports_os_sys_and_thread_and_its_callbacks_the_start_up_layer() -> None:
    """At start-up it imports nothing of the package (which would bring the package, ``_env``
    and ``_startup``); its callbacks import ``_startup`` when they run."""
    tree = ast.parse(Path(boot.__file__).read_text(encoding="utf-8"))
    at_import: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            at_import |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            at_import.add(node.module or "")
    assert at_import <= {"os", "sys", "_thread"}, at_import
    later = {
        node.module
        for function in tree.body
        if isinstance(function, ast.FunctionDef)
        for node in ast.walk(function)
        if isinstance(node, ast.ImportFrom)
    }
    assert later == {"reloadpg_autopatch._startup"}, later


# Run in a fresh interpreter of this environment, where the package is installed (editable in
# a checkout, a wheel in CI's lanes), so the .pth line runs as in a user's process.
PROBE = r"""
import json, sys
print(json.dumps({
    "loaded": sorted(
        m for m in sys.modules if m.startswith(("reloadpg_autopatch", "_reloadpg_autopatch_boot"))
    ),
    "hooks": sum(type(f).__module__ == "_reloadpg_autopatch_boot" for f in sys.meta_path),
    "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
}))
"""


def _start(**env: str) -> tuple[dict, str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(proc.stdout), proc.stderr


@pytest.mark.parametrize(
    ("env", "checked"),
    [
        ({"SLIME_RELOADABLE_PG": "1"}, False),
        ({"SLIME_RELOADABLE_PG": "on", "SLIME_RELOADABLE_PG_MODE": ""}, False),
        ({"SLIME_RELOADABLE_PG": "1", "SLIME_RELOADABLE_PG_MODE": "suspend"}, True),
        ({"SLIME_RELOADABLE_PG": "1", "SLIME_RELOADABLE_PG_LOG": "LOUD"}, True),
    ],
)
def test_the_gate_alone_imports_the_boot_module_alone(env: dict, checked: bool) -> None:
    """The gate on and no other variable of ours set: one module at start-up. Another variable
    set: its value is checked at start-up (``_startup``), and a bad one is said there."""
    out, stderr = _start(**env)
    assert out["hooks"] == 2, out  # the finder of torch.distributed, the adoption's watcher
    assert out["torch"] == [], out  # checking a value never imports torch
    assert ("_reloadpg_autopatch_boot" in out["loaded"]) is True
    assert ("reloadpg_autopatch._startup" in out["loaded"]) is checked, out
    if not checked:
        assert out["loaded"] == ["_reloadpg_autopatch_boot"], out
    bad = env.get("SLIME_RELOADABLE_PG_LOG") == "LOUD"
    assert ("SLIME_RELOADABLE_PG_LOG" in stderr) is bad, stderr
