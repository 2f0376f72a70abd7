"""``python -m reloadpg_autopatch demo --framework slime``: an unmodified actor, adopted.

It starts N ranks (``demo_actor``, each a fresh interpreter with the gate, the mode and the
actor's lifecycle module named for adoption), each running a slime-shaped actor
(``framework_demo/``) that never imports this package. One line per training step as every
rank finishes it, then a verdict.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

from .. import _env
from . import launch
from .demo import MAX_WORLD_SIZE, plural

#: The frameworks ``--framework`` can show: their actor-shaped program and lifecycle module.
FRAMEWORKS = ("slime",)


class _StepPrinter:
    """Prints a step's line once every rank has reported it (``--framework``)."""

    def __init__(self, world_size: int, steps: int, stream: TextIO, quiet: bool) -> None:
        self.world_size, self.steps, self.stream, self.quiet = world_size, steps, stream, quiet
        self.pending: dict[Any, list[dict[str, Any]]] = {}
        self.rows: list[dict[str, Any]] = []
        self.ready: dict[str, Any] | None = None

    def __call__(self, rank: int, event: dict[str, Any]) -> None:
        if event["type"] not in ("ready", "step"):
            return
        key = event["type"] if event["type"] == "ready" else event["step"]
        reports = self.pending.setdefault(key, [])
        reports.append({**event, "rank": rank})
        if len(reports) < self.world_size:
            return
        del self.pending[key]
        first = min(reports, key=lambda r: r["rank"])
        if key == "ready":
            self.ready = first
            adoption = first["adoption"]
            how = (
                f"adopted: {', '.join(adoption['adopted'])} call reloadpg_autopatch's lifecycle"
                if adoption["kept"] is None
                else f"NOT adopted, it keeps its own lifecycle ({adoption['kept']})"
            )
            self._say(
                f"setup: {first['mode']} mode; the actor's lifecycle module is {how}; WORLD and "
                f"the actor's groups on cpu_suspend (a CPU model of NCCL's suspend), "
                f"{first['backends']} per rank"
            )
            return
        row = {
            "step": key,
            "trained": [r["trained"] for r in sorted(reports, key=lambda r: r["rank"])],
            "weights": first["weights"],
            "cycles": first["cycles"],
            "suspended": min(r["suspended"] for r in reports),
            "created": max(r["created"] for r in reports),
            "their_groups": max(r["their_groups"] for r in reports),
        }
        self.rows.append(row)
        slept = (
            f"{row['suspended']} groups per rank suspended and resumed twice"
            if row["suspended"]
            else "no group suspended"
        )
        cycle = f"package cycle {row['cycles']}" if row["cycles"] else "the package ran no cycle"
        self._say(
            f"step {key}/{self.steps}: train and update_weights (2 destroy/reload pairs), "
            f"{cycle}; {slept}, {row['created']} created again, the actor's class holds "
            f"{row['their_groups']} groups; weights {row['weights']:g}"
        )

    def _say(self, line: str) -> None:
        if not self.quiet:
            print(line, file=self.stream, flush=True)


def run_framework_demo(
    framework: str,
    world_size: int = 2,
    steps: int = 3,
    mode: str = "suspend",
    *,
    port: int = 0,
    timeout: float = 120.0,
    as_json: bool = False,
    stream: TextIO = sys.stdout,
) -> int:
    """``demo --framework slime``: an unmodified slime-shaped actor on N CPU ranks, adopted.

    Each rank is a fresh interpreter with the gate, the mode, and the actor's lifecycle module
    named in ``SLIME_RELOADABLE_PG_ADOPT_MODULES``; the actor's groups run on ``cpu_suspend``.
    Returns the exit code (0 OK, 1 failure).
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ValueError(f"world_size must be from 1 to {MAX_WORLD_SIZE}, got {world_size}")
    from .demo_actor import LIFECYCLE

    printer = _StepPrinter(world_size, steps, stream, quiet=as_json)
    printer._say(
        f"reloadpg_autopatch demo: {plural(world_size, 'rank')}, an unmodified {framework}-shaped "
        f"actor, {plural(steps, 'step')} in {mode} mode, each rank a fresh interpreter with "
        f"SLIME_RELOADABLE_PG=1"
    )
    env = dict(os.environ)
    env[_env.GATE] = "1"
    env[_env.MODE_ENV] = mode
    named = [m for m in env.get(_env.ADOPT_MODULES_ENV, "").split(",") if m.strip()]
    env[_env.ADOPT_MODULES_ENV] = ",".join([*named, LIFECYCLE])
    env.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    command = [sys.executable, "-m", "reloadpg_autopatch.tools.demo_actor"]
    command += ["--steps", str(steps), "--timeout", repr(float(timeout))]
    error = None
    try:
        launch.launch(command, world_size, env=env, timeout=timeout, port=port, on_event=printer)
    except launch.PortInUse:
        raise
    except launch.LaunchError as failure:
        error = failure
    ok = error is None and printer.ready is not None and len(printer.rows) == steps
    if as_json:
        report = {
            "ok": ok,
            "framework": framework,
            "world_size": world_size,
            "mode": mode,
            "setup": printer.ready,
            "steps": printer.rows,
            "error": None if error is None else str(error),
            "failed_rank": None if error is None else error.rank,
        }
        print(json.dumps(report, indent=2), file=stream)
    elif ok:
        adopted = (printer.ready or {}).get("adoption", {}).get("kept") is None
        lifecycle = f"reloadpg_autopatch's {mode} mode" if adopted else "its own lifecycle"
        print(
            f"verdict: OK - {plural(world_size, 'rank')} ran {plural(steps, 'step')} "
            f"({2 * steps} destroy/reload pairs) of an unmodified {framework}-shaped actor on "
            f"{lifecycle}; every result matched",
            file=stream,
        )
    else:
        print(f"verdict: FAILED - {error}", file=stream)
    return 0 if ok else 1
