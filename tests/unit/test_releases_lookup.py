"""Megatron's releases are read from modules already imported, never imported for it.

The lookup runs at every destroy that begins a cycle, in every process of a job, Megatron or
not; the whole path (a destroy running them on gloo ranks) is ``tests/ranks/test_hooks.py``.
The oracle is ``sys.modules`` in a fresh interpreter, before and after.
"""

from __future__ import annotations

import subprocess
import sys

from tests.support import ROOT

PROGRAM = """
import sys
from reloadpg_autopatch.groups import releases
source, found = releases.found()
print(source, len(found), any(m.split(".")[0] == "megatron" for m in sys.modules))
"""


def test_looking_for_megatrons_releases_imports_no_megatron() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["none", "0", "False"], proc.stdout
