"""The boot module (``_reloadpg_autopatch_boot``): what start-up imports where the gate is on.

It holds the few names start-up needs of ``_env`` written out, so that start-up imports no
module of the package; these tests keep the two equal and check its imports (which path an
installed interpreter takes at start-up: ``tests/install/test_activation.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import _reloadpg_autopatch_boot as boot
import reloadpg_autopatch
from reloadpg_autopatch import _env

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
