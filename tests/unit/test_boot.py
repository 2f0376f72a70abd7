"""The boot module (``_reloadpg_autopatch_boot``): what start-up imports where the gate is on.

It holds the few names start-up needs of ``_env`` written out, so that start-up imports no
module of the package; these tests keep the two equal, and check which path a process takes.
"""

from __future__ import annotations

import json
import subprocess
import sys

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


# Run in a fresh interpreter of this environment, where the package is installed (editable in
# a checkout, a wheel in CI's lanes), so the .pth line runs as in a user's process.
PROBE = r"""
import json, sys
print(json.dumps({
    "loaded": sorted(
        m for m in sys.modules if m.startswith(("reloadpg_autopatch", "_reloadpg_autopatch_boot"))
    ),
    "hooks": sum(type(f).__module__ == "_reloadpg_autopatch_boot" for f in sys.meta_path),
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
    assert ("_reloadpg_autopatch_boot" in out["loaded"]) is True
    assert ("reloadpg_autopatch._startup" in out["loaded"]) is checked, out
    if not checked:
        assert out["loaded"] == ["_reloadpg_autopatch_boot"], out
    bad = env.get("SLIME_RELOADABLE_PG_LOG") == "LOUD"
    assert ("SLIME_RELOADABLE_PG_LOG" in stderr) is bad, stderr
