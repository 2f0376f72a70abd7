"""GPU smoke test: the demo's whole cycle on NCCL at world size 1. Not part of the tests.

It runs the cycle twice when the installed torch can: in the wrapper mode on ``nccl``, and in
native mode (groups reconfigured in place) on ``nccl2``, torch 2.14's backend that supports it,
reporting the free GPU memory after each destroy and each reload side by side.

Run it on a machine with a CUDA GPU, after ``pip install -e .`` (or a wheel) in the same
environment so that the rank starts with the ``.pth`` active:

    python scripts/gpu_smoke.py [--cycles K]

It prints what it checked (Megatron's groups on NCCL, collectives on CUDA tensors through
Megatron's bound functions, WORLD swapped to gloo and back, free GPU memory around each
destroy) and exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import io
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("gpu_smoke: no CUDA device is visible; nothing was checked", file=sys.stderr)
        return 2
    if not torch.distributed.is_nccl_available():
        print("gpu_smoke: this torch build has no NCCL; nothing was checked", file=sys.stderr)
        return 2
    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
        f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
    )
    from reloadpg_autopatch.tools.demo import run_demo

    runs = [("nccl", "wrapper")]
    if hasattr(torch.distributed.ProcessGroup, "reconfigure") and (
        "nccl2" in torch.distributed.Backend.backend_list
    ):
        runs.append(("nccl2", "native"))
    else:
        print("gpu_smoke: this torch has no nccl2 backend or no reconfigure: native mode skipped")
    failures = []
    for backend, mode in runs:
        failures += _run(run_demo, backend, mode, args)
    for failure in failures:
        print(f"FAILED: {failure}")
    print("gpu_smoke: OK" if not failures else "gpu_smoke: FAILED")
    return 0 if not failures else 1


def _run(run_demo: object, backend: str, mode: str, args: argparse.Namespace) -> list[str]:
    out = io.StringIO()
    code = run_demo(
        1, args.cycles, backend, mode=mode, timeout=args.timeout, as_json=True, stream=out
    )
    report = json.loads(out.getvalue())
    setup = report.get("setup") or {}
    label = f"{backend}, {mode} mode"
    print(
        f"[{label}] setup: megatron-core {report.get('megatron_core')}, "
        f"activation {setup.get('activation')}, {setup.get('groups')} reloadable groups, "
        f"{setup.get('collectives')} collectives checked, bindings {setup.get('bindings')}"
    )
    failures = [] if report["ok"] else [f"{label}: {report['error']}"]
    for row in report["cycles"]:
        live, destroyed, reloaded = row.get("free_mib") or (None, None, None)
        print(
            f"[{label}] cycle {row['cycle']}: destroy {row['destroy_ms']:.1f} ms, reload "
            f"{row['reload_ms']:.1f} ms, collectives {row['collectives']}, free GPU MiB "
            f"live {live:.0f} / after destroy {destroyed:.0f} / after reload {reloaded:.0f}"
            if live is not None
            else f"[{label}] cycle {row['cycle']}: {row}"
        )
        if live is not None and destroyed < live:
            failures.append(f"{label}, cycle {row['cycle']}: destroying freed no GPU memory")
    if setup and setup.get("activation") != ["pth"]:
        failures.append(f"{label}: the rank was not patched at start-up: install the package")
    if code != 0 and not failures:
        failures.append(f"{label}: the demo exited {code}")
    return failures


if __name__ == "__main__":
    sys.exit(main())
