"""A failed rank of the launcher ends with exit code 1, whatever its interpreter's exit would do.

Seen in CI: the demo's rank 1, failing on purpose, exited with SIGABRT ("terminate called without
an active exception": gloo's threads torn down at interpreter exit), and the launcher blamed the
signal, not the failure. The interpreter's teardown is modelled by an ``atexit`` handler that
aborts the process; ``launch.fail`` must end the rank before it runs.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.timeout(60)]

RANK = r"""
import atexit, os, signal, sys
atexit.register(lambda: os.kill(os.getpid(), signal.SIGABRT))  # as gloo's teardown can
from reloadpg_autopatch.tools import launch
try:
    raise RuntimeError("rank 1 failed on purpose")
except Exception as error:
    if sys.argv[1] == "fail":
        launch.fail(error)
    raise
"""


@pytest.mark.parametrize("how", ["fail", "raise"])
def test_a_failed_rank_ends_with_exit_code_1_and_says_why(how: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", RANK, how], capture_output=True, text=True, timeout=30
    )
    if how == "raise":  # the model holds: an exception left to the interpreter ends in SIGABRT
        assert proc.returncode < 0, proc.returncode
        return
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    tag = "@reloadpg_autopatch "
    events = [
        json.loads(line[len(tag) :]) for line in proc.stdout.splitlines() if line.startswith(tag)
    ]
    assert events == [{"type": "error", "message": "RuntimeError: rank 1 failed on purpose"}]
    assert "Traceback" in proc.stderr, proc.stderr
    assert "rank 1 failed on purpose" in proc.stderr, proc.stderr
