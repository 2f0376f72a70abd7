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

Then, on each backend, what CPU cannot show (one rank started with the gate alone): the memory
guard before a reloaded group's first collective (free memory before and after it emptied a
cache the test filled), a CUDA memory pool registered on a group's backend and registered again
after each reload (by the package, and a framework's hook doing the same is not doubled), and
the cycle report's memory figures against ``torch.cuda.mem_get_info``.

Last, the suspend pass (``scripts/gpu_suspend.py``): torch's raw suspend/resume at world size 1
and 2 on the one GPU, the package's suspend mode, and the probes, into ``suspend.json``.

    python scripts/gpu_smoke.py --out DIR [--cycles K] [--suspend-only | --skip-suspend]

writes ``DIR/smoke.json`` (what each check found) and ``DIR/suspend.json``.
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
    parser.add_argument("--out", default=".", help="folder for smoke.json and suspend.json")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--suspend-only", action="store_true", help="only the suspend pass")
    which.add_argument("--skip-suspend", action="store_true", help="no suspend pass")
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
    import os

    os.makedirs(args.out, exist_ok=True)
    failures: list[str] = []
    if not args.suspend_only:
        for backend, mode in runs:
            failures += _run(run_demo, backend, mode, args)
            failures += _parity(backend, mode, args)
        with open(os.path.join(args.out, "smoke.json"), "w", encoding="utf-8") as handle:
            json.dump({"torch": torch.__version__, "failures": failures}, handle, indent=1)
    if not args.skip_suspend:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import gpu_suspend

        if gpu_suspend.main(["--out", os.path.join(args.out, "suspend.json")]) != 0:
            failures.append("the suspend pass failed: see suspend.json")
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


def _parity(backend: str, mode: str, args: argparse.Namespace) -> list[str]:
    """Start one gate-activated rank running ``_parity_rank`` and print what it measured."""
    import os

    from reloadpg_autopatch.tools import launch

    label = f"{backend}, {mode} mode"
    events: list[dict] = []
    env = {**os.environ, "SLIME_RELOADABLE_PG": "1", "SLIME_RELOADABLE_PG_MODE": mode}
    command = [sys.executable, __file__, "--parity-rank", "--backend", backend]
    try:
        launch.launch(
            command, 1, env=env, timeout=args.timeout, on_event=lambda _r, e: events.append(e)
        )
    except launch.LaunchError as error:
        return [f"{label}: parity checks: {error}"]
    failures = []
    for event in events:
        if event.get("type") == "parity":
            print(f"[{label}] {event['check']}: {event['detail']}")
            if not event["ok"]:
                failures.append(f"{label}: {event['check']}: {event['detail']}")
    if not any(e.get("type") == "parity" for e in events):
        failures.append(f"{label}: the parity rank reported nothing")
    return failures


def _parity_rank(argv: list[str]) -> int:
    """One rank: the guard, a memory pool across reloads, the report's memory figures."""
    import logging

    import torch
    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.tools import launch

    parser = launch.rank_parser("gpu_smoke parity rank")
    parser.add_argument("--parity-rank", action="store_true")
    parser.add_argument("--backend", default="nccl")
    args = parser.parse_args(argv)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)

    def say(check: str, ok: bool, detail: str) -> None:
        launch.emit({"type": "parity", "check": check, "ok": bool(ok), "detail": detail})

    say("activation", rpg.is_patched(), f"patched at start-up: {rpg.is_patched()}")
    launch.init_rank(args, backend=args.backend, timeout=120.0)
    rpg.set_wrap_policy("all")
    group = dist.new_group([0])
    one = torch.ones(1, device=device)
    dist.all_reduce(one, group=group)  # the communicator exists: a pool can be registered

    # A pool registered through the reloadable group, as Megatron's nccl_allocator does.
    registered = []
    pool = getattr(torch.cuda, "MemPool", None)
    pool = pool() if pool is not None else None
    if pool is not None:
        backend = group._get_backend(device)
        if hasattr(backend, "register_mem_pool"):
            with torch.cuda.use_mem_pool(pool):
                kept = torch.ones(1 << 20, device=device)  # a segment for the pool
            backend.register_mem_pool(pool)
            registered.append(kept)
    hook_calls = []

    def restore_pool(groups: list) -> None:  # what a framework's own hook would do
        hook_calls.append(len(groups))
        if registered:
            group._get_backend(device).register_mem_pool(pool)

    rpg.add_reload_hook(after_reload=restore_pool, name="restore_pool")

    seen: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger = logging.getLogger("reloadpg_autopatch")
    logger.addHandler(Catch())
    logger.setLevel(logging.INFO)
    total = torch.cuda.mem_get_info(device)[1]
    rpg.set_memory_guard(min_free_gb=2 * total / 2**30)  # always "low": the guard must act
    # In native mode the guard runs inside the reload, before the group's in-place rebuild;
    # behind a wrapper, before the group's first collective after it.
    native = type(group) is dist.ProcessGroup

    def fill_cache() -> tuple[int, int]:
        cache = torch.empty(1 << 30, dtype=torch.uint8, device=device)  # 1 GiB, then cached
        del cache
        seen.clear()
        return torch.cuda.mem_get_info(device)[0], torch.cuda.memory_reserved(device)

    for cycle in (1, 2):
        rpg.destroy_process_groups()
        if native:
            before, reserved = fill_cache()
        rpg.reload_process_groups()
        if not native:
            before, reserved = fill_cache()
        t = torch.full((4,), 2.0, device=device)
        dist.all_reduce(t, group=group)
        torch.cuda.synchronize(device)
        after = torch.cuda.mem_get_info(device)[0]
        acted = any("emptying the cache" in line for line in seen)
        say(
            f"guard, cycle {cycle}",
            acted and after > before and torch.cuda.memory_reserved(device) < reserved,
            f"free {before / 2**30:.2f} GiB before the guard, {after / 2**30:.2f} "
            f"GiB after it (the guard {'acted' if acted else 'did NOT act'}); reserved "
            f"{reserved / 2**30:.2f} -> {torch.cuda.memory_reserved(device) / 2**30:.2f} GiB; "
            f"all_reduce {t.tolist()}",
        )
        report = rpg.last_cycle_report().to_dict()
        figures = report["memory"]
        ok = all(figures[p] is not None for p in ("before_destroy", "after_destroy"))
        say(
            f"cycle report, cycle {cycle}",
            ok and report["device"] == str(device),
            f"{report['device']}: free before destroy "
            + ", ".join(
                f"{p} {f['free'] / 2**30:.2f} GiB" for p, f in figures.items() if f is not None
            )
            + f"; destroy gave back {(report['freed_bytes'] or 0) / 2**20:.0f} MiB",
        )
    if registered:
        from reloadpg_autopatch.groups import pools

        # In native mode the group is torch's own: only the hook registers the pool again.
        record = getattr(group, "_record", None)
        entries = [h for h in record.replays if h[0] == pools.ENTRY] if record else []
        with torch.cuda.use_mem_pool(pool):
            x = torch.full((1 << 10,), 1.0, device=device)
        dist.all_reduce(x, group=group)
        say(
            "memory pool",
            len(entries) == (0 if native else 1) and hook_calls == [1, 1] and x[0].item() == 1.0,
            f"kept registrations {len(entries)} (want {0 if native else 1}: the hook's "
            f"re-registration is not doubled); hook calls {hook_calls}; all_reduce on pool "
            f"memory {x[0].item()}",
        )
    else:
        say("memory pool", True, "this torch has no MemPool/register_mem_pool: skipped")
    rpg.set_memory_guard()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    if "--parity-rank" in sys.argv:
        sys.exit(_parity_rank(sys.argv[1:]))
    sys.exit(main())
