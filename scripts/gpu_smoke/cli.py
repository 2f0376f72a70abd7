"""GPU smoke run: every NCCL path of the package on one GPU, with data from the first run.

The command line of ``scripts/gpu_smoke.py``: the preflight first, then each step it allows,
as the budget and ``--steps`` allow; ``--plan`` prints the worst-case table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from .common import BUDGET_S, SCALE_ENV, dig
from .plan import Facts, Step
from .record import Record
from .runner import run_step
from .sessions import Interrupted
from .steps import STEPS, worst_case_table


def _preflight_data(entry: dict[str, Any]) -> dict[str, Any]:
    runs = entry["runs"]
    data = dict(runs[0]["ranks"][0]["data"]) if runs and runs[0]["ranks"] else {}
    data["nvidia_smi"] = runs[0]["memory_before"] if runs else None  # the driver, the GPU
    return data


def _no_device(pre: dict[str, Any]) -> str | None:
    if dig(pre, "torch", "version") is None:
        return f"torch is not importable here: {dig(pre, 'torch_error') or 'no preflight data'}"
    if not dig(pre, "cuda", "available"):
        return (
            f"no CUDA device: torch {dig(pre, 'torch', 'version')} sees no GPU "
            "(torch.cuda.is_available() is False); --rehearse rehearses the steps on CPU"
        )
    if not dig(pre, "torch", "nccl_available"):
        return f"torch {dig(pre, 'torch', 'version')} has no NCCL"
    return None


def main(argv: list[str] | None = None) -> int:
    """The script's command line; its exit status (0, 1, 2 or 130: see the script)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="folder for smoke.json (created if missing)")
    parser.add_argument(
        "--budget",
        type=float,
        default=BUDGET_S,
        metavar="SECONDS",
        help=f"start no step whose worst case no longer fits (default {BUDGET_S:g})",
    )
    parser.add_argument("--rehearse", action="store_true", help="the same steps on CPU")
    parser.add_argument(
        "--steps",
        metavar="NAME,...",
        help="run only these steps (and the preflight); e.g. a second try with the time left: "
        + ", ".join(s.name for s in STEPS[1:]),
    )
    parser.add_argument("--plan", action="store_true", help="print the worst-case table")
    args = parser.parse_args(argv)
    if args.plan:
        print(json.dumps(worst_case_table(), indent=1))
        return 0
    if not args.out:
        parser.error("--out DIR is required")
    names = {s.name for s in STEPS}
    args.selected = None
    if args.steps:
        args.selected = {n.strip() for n in args.steps.split(",") if n.strip()}
        if unknown := sorted(args.selected - names):
            parser.error(f"--steps: no step {', '.join(unknown)}; the steps: {sorted(names)}")
    try:
        scale = float(os.environ.get(SCALE_ENV, "1"))
    except ValueError:
        parser.error(f"{SCALE_ENV} must be a number")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = Record(out, args.rehearse, args.budget, argv)
    record.data["selected"] = sorted(args.selected) if args.selected else None
    record.data["deadline_scale"] = scale
    record.write()

    def interrupted(signum: int, _frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, interrupted)
    try:
        code = _steps(record, args)
    except Interrupted as stop:
        record.data.update(status="interrupted", reason=f"stopped by {stop}", exit_code=130)
        record.write()
        print(f"gpu_smoke: interrupted ({stop}); {record.path} holds the steps so far")
        return 130
    record.data["exit_code"] = code
    record.write()
    return code


def _steps(record: Record, args: argparse.Namespace) -> int:
    mode = "rehearsal" if args.rehearse else "GPU"
    print(f"gpu_smoke ({mode}): writing {record.path} after every step", flush=True)
    preflight, _ = run_step(STEPS[0], Facts({}, args.rehearse), record, args.budget)
    pre = _preflight_data(preflight)
    record.data["preflight"] = pre
    _say(preflight)
    if preflight["status"] != "ok" and not pre.get("torch"):
        record.data.update(status="done", reason="the preflight failed: see steps[0]")
        record.write()
        return 1
    if not args.rehearse and (reason := _no_device(pre)) is not None:
        record.data.update(status="no-device", reason=reason, exit_code=2)
        for step in STEPS[1:]:
            record.data["steps"].append(_skipped(step, reason))
        record.write()
        print(f"gpu_smoke: {reason}; nothing else was run", file=sys.stderr)
        return 2
    facts = Facts(pre, args.rehearse)
    for step in STEPS[1:]:
        if args.selected is not None and step.name not in args.selected:
            entry = _skipped(step, "not selected (--steps)")
            record.data["steps"].append(entry)
            record.write()
        else:
            entry, _runs = run_step(step, facts, record, args.budget)
        _say(entry)
    record.data["status"] = "done"
    failures = record.data["failures"]
    for failure in failures:
        print(f"FAILED: {failure}")
    print("gpu_smoke: OK" if not failures else "gpu_smoke: FAILED", flush=True)
    return 1 if failures else 0


def _skipped(step: Step, reason: str) -> dict[str, Any]:
    return {
        "name": step.name,
        "title": step.title,
        "status": "skipped",
        "reason": f"skipped: {reason}",
        "worst_case_s": 0.0,
        "started_s": None,
        "wall_s": 0.0,
        "runs": [],
        "summary": {},
        "failures": [],
    }


def _say(entry: dict[str, Any]) -> None:
    wall = f" ({entry['wall_s']:.1f} s)" if entry.get("wall_s") else ""
    if entry["status"] == "skipped":
        print(f"[{entry['name']}] {entry['reason']}", flush=True)
        return
    reason = f": {entry['reason']}" if entry.get("reason") else ""
    print(f"[{entry['name']}] {entry['status']}{wall}{reason}", flush=True)
    for name, figures in (entry.get("summary") or {}).items():
        print(f"  {name}: {json.dumps(figures, default=str)[:400]}", flush=True)
