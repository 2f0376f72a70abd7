"""The GPU between runs: free (``nvidia-smi``: memory used, compute processes) before each."""

from __future__ import annotations

import shutil
import subprocess
import time
from typing import Any

from .common import CHECK_S


def _nvidia_smi(query: str, kind: str, timeout: float) -> list[list[str]] | None:
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None
    try:
        done = subprocess.run(
            [tool, f"--query-{kind}={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=max(timeout, 0.5),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [[c.strip() for c in row.split(",")] for row in done.stdout.splitlines() if row.strip()]


def gpu_memory(rehearse: bool, wait_s: float = CHECK_S) -> dict[str, Any]:
    """The GPU's memory and compute processes before a run; waits up to ``wait_s`` for free."""
    if rehearse:
        return {"source": "rehearsal: no device", "ok": True}
    deadline = time.monotonic() + wait_s
    while True:
        query = "memory.used,memory.total,driver_version,name"
        rows = _nvidia_smi(query, "gpu", deadline - time.monotonic())
        if not rows or len(rows[0]) < 4:
            return {"source": "nvidia-smi unavailable", "ok": None}
        try:
            used, total = (int(float(v)) for v in rows[0][:2])
        except ValueError:
            return {"source": "nvidia-smi", "ok": None, "raw": rows[0]}
        apps = _nvidia_smi("pid,used_memory", "compute-apps", deadline - time.monotonic())
        reading = {
            "source": "nvidia-smi",
            "used_mib": used,
            "total_mib": total,
            "driver": rows[0][2],
            "name": rows[0][3],
            "processes": [row[0] for row in apps or []],
        }
        free = used <= max(1024, 0.03 * total) and not apps
        if free or time.monotonic() > deadline:
            return {**reading, "ok": free}
        time.sleep(0.5)
