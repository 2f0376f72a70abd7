"""``smoke.json``: one object, rewritten whole at every change, so a run cut at any moment
leaves the steps so far and what the running step's ranks had said."""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from .common import SCHEMA
from .steps import STEPS, worst_case_table


class Record:
    """``smoke.json``: rewritten whole (a temporary file, then a rename) at every change."""

    def __init__(self, out: Path, rehearse: bool, budget: float, argv: list[str]) -> None:
        self.path = out / "smoke.json"
        self.started = time.monotonic()
        self.data: dict[str, Any] = {
            "schema": SCHEMA,
            "script": "scripts/gpu_smoke.py",
            "mode": "rehearsal" if rehearse else "gpu",
            "status": "running",
            "exit_code": None,
            "reason": None,
            "argv": argv,
            "python": sys.executable,
            "host": platform.node(),
            "started": _now(),
            "updated": _now(),
            "elapsed_s": 0.0,
            "budget_s": budget,
            "worst_case": worst_case_table(),
            "preflight": None,
            "plan": [s.name for s in STEPS],
            "steps": [],
            "warnings": [],
            "failures": [],
        }

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def write(self) -> None:
        self.data["updated"] = _now()
        self.data["elapsed_s"] = round(self.elapsed(), 2)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(self.data, handle, indent=1, default=str)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
