"""``python -m reloadpg_autopatch demo``: the whole cycle on real ranks, on a laptop's CPU.

It starts N ranks as fresh interpreters with ``SLIME_RELOADABLE_PG=1`` (nothing else changes
in them), lets each build Megatron's groups (plain torch groups without megatron-core), checks
collectives through the functions Megatron bound at import time, then destroys and reloads
every group, WORLD included, K times. One line per cycle as it finishes, then a verdict.
``demo --framework`` is ``demo_framework``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

from .. import _env
from . import launch

#: The most ranks the demo starts. Every rank is a whole interpreter with torch loaded (about
#: 0.3-0.5 GB resident and seconds of CPU to start) meshed with every other one over TCP, all on
#: this one machine: 64 of them already need some 20-30 GB and minutes on a small machine, and a
#: larger number is a typo, not a test, so it is refused before anything is started.
MAX_WORLD_SIZE = 64


def plural(n: int, noun: str) -> str:
    """``n`` and the noun, in the plural unless ``n`` is 1 (both demos' lines)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _fmt_bindings(bindings: dict[str, int] | None) -> str:
    if not bindings or not bindings.get("found"):
        return "n/a (no megatron-core)"
    if bindings.get("native"):
        return f"none needed ({bindings['native']} stay torch's own: groups reload in place)"
    return f"{bindings['patched']}/{bindings['found']}"


class _Printer:
    """Prints a cycle's line once every rank has reported that cycle."""

    def __init__(self, world_size: int, cycles: int, stream: TextIO, quiet: bool) -> None:
        self.world_size, self.cycles, self.stream, self.quiet = world_size, cycles, stream, quiet
        self.pending: dict[Any, list[dict[str, Any]]] = {}
        self.cycle_rows: list[dict[str, Any]] = []
        self.ready: dict[str, Any] | None = None

    def __call__(self, rank: int, event: dict[str, Any]) -> None:
        if event["type"] not in ("ready", "cycle"):
            return
        key = event["type"] if event["type"] == "ready" else event["cycle"]
        reports = self.pending.setdefault(key, [])
        reports.append({**event, "rank": rank})
        if len(reports) < self.world_size:
            return
        del self.pending[key]
        row = {
            "groups": reports[0]["groups"],
            "collectives": sum(r["collectives"] for r in reports),
            "bindings": min(
                (r["bindings"] for r in reports), key=lambda b: (b["patched"], -b.get("native", 0))
            ),
        }
        if key == "ready":
            row.update(
                activation=sorted({r["activation"] for r in reports}),
                megatron=reports[0]["megatron"],
                tp=reports[0]["tp"],
            )
            self.ready = row
            megatron = reports[0]["megatron"]
            kind = (
                f"Megatron's groups (megatron-core {megatron}, TP={row['tp']})"
                if megatron
                else "plain torch groups (megatron-core is not importable)"
            )
            self._say(
                f"setup: {kind}, {row['groups']} reloadable groups per rank, "
                f"{row['collectives']} collectives checked, "
                f"bindings patched {_fmt_bindings(row['bindings'])}; "
                + (
                    "patched at start-up by the .pth on every rank"
                    if row["activation"] == ["pth"]
                    else "NOTE: the .pth did not run in the ranks (is the package installed in "
                    "this interpreter?), so they patched late and relied on the sweep"
                )
            )
            return
        first = min(reports, key=lambda r: r["rank"])
        row.update(
            cycle=key,
            destroy_ms=max(r["destroy_ms"] for r in reports),
            reload_ms=max(r["reload_ms"] for r in reports),
            # Rank 0's cycle report: each step's phases, the groups, free memory.
            report=first.get("report"),
        )
        self.cycle_rows.append(row)
        self._say(
            f"cycle {key}/{self.cycles}: groups {row['groups']}, "
            f"destroy {row['destroy_ms']:.1f} ms, reload {row['reload_ms']:.1f} ms, "
            f"collectives checked {row['collectives']}, "
            f"bindings patched {_fmt_bindings(row['bindings'])}"
        )
        if row["report"]:
            from ..groups.report import describe

            self._say(f"  report, rank {first['rank']}: {describe(row['report'])}")

    def _say(self, line: str) -> None:
        if not self.quiet:
            print(line, file=self.stream, flush=True)


def run_demo(
    world_size: int = 4,
    cycles: int = 3,
    backend: str = "gloo",
    mode: str = "wrapper",
    *,
    port: int = 0,
    timeout: float = 120.0,
    as_json: bool = False,
    inject_failure: int | None = None,
    stream: TextIO = sys.stdout,
) -> int:
    """Run the demo; returns the exit code (0 OK, 1 failure). Arguments are validated by the CLI.

    ``timeout`` covers the whole run, starting the ranks included.
    """
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ValueError(f"world_size must be from 1 to {MAX_WORLD_SIZE}, got {world_size}")
    printer = _Printer(world_size, cycles, stream, quiet=as_json)
    printer._say(
        f"reloadpg_autopatch demo: {plural(world_size, 'rank')} on {backend}, "
        f"{plural(cycles, 'cycle')}, each rank a fresh interpreter with SLIME_RELOADABLE_PG=1"
    )
    env = dict(os.environ)
    env[_env.GATE] = "1"
    env[_env.MODE_ENV] = mode
    env.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    command = [sys.executable, "-m", "reloadpg_autopatch.tools.demo_rank"]
    command += ["--cycles", str(cycles), "--backend", backend, "--timeout", repr(float(timeout))]
    if inject_failure is not None:
        command += ["--inject-failure", str(inject_failure)]
    error = None
    try:
        launch.launch(command, world_size, env=env, timeout=timeout, port=port, on_event=printer)
    except launch.PortInUse:
        raise  # not a failed run: nothing started; the CLI reports it
    except launch.LaunchError as failure:
        error = failure
    ok = error is None and printer.ready is not None and len(printer.cycle_rows) == cycles
    if as_json:
        report = {
            "ok": ok,
            "world_size": world_size,
            "backend": backend,
            "mode": mode,
            "megatron_core": (printer.ready or {}).get("megatron"),
            "setup": printer.ready,
            "cycles": printer.cycle_rows,
            "error": None if error is None else str(error),
            "failed_rank": None if error is None else error.rank,
        }
        print(json.dumps(report, indent=2), file=stream)
    elif ok:
        ready = printer.ready or {}
        print(
            f"verdict: OK - {plural(world_size, 'rank')} destroyed and reloaded "
            f"{ready.get('groups')} groups and WORLD {plural(cycles, 'time')}; "
            "every collective matched",
            file=stream,
        )
    else:
        print(f"verdict: FAILED - {error}", file=stream)
    return 0 if ok else 1
