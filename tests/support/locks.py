"""Locks held across processes of the whole machine: ``.ci/run`` runs two test lanes at once.

What the two lanes would otherwise do at the same moment to one shared thing takes a lock: a
build of this checkout (setuptools writes ``reloadpg_autopatch.egg-info`` into the source tree)
and a local Ray cluster (its ports and its ``/tmp/ray`` session folder). The lock files live in
``/tmp`` itself, not under a lane's own ``TMPDIR``.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator


@contextlib.contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Hold the machine-wide lock ``name`` for the block."""
    with open(f"/tmp/reloadpg_autopatch-tests-{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
