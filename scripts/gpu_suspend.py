"""GPU check of the suspend mode on one GPU: torch's raw API first, then the package's mode.

Run by ``scripts/gpu_smoke.py`` (or alone: ``python scripts/gpu_suspend.py --out suspend.json``).
Not part of the tests; it needs a CUDA GPU and NCCL 2.29.7 or later. It fits in about seven
minutes on one H200 and writes its JSON after every run, so a hang loses nothing before it.

- World size 1, and 2 on the same GPU (``NCCL_MULTI_RANK_GPU_ENABLE=1``, NCCL 2.30+), eager
  init with ``device_id``: ``memory_stats()`` and free memory awake, asleep and resumed; the
  milliseconds of suspend and resume against destroy + re-create + first collective; results
  correct after every resume.
- The package (``SLIME_RELOADABLE_PG=1``, ``SLIME_RELOADABLE_PG_MODE=suspend``, WORLD
  registered): WORLD stays the same object, a CUDA collective while asleep raises the package's
  ``GroupSuspendedError``, a gloo group keeps working, the cycle report's NCCL figures beside
  ``memory_stats()`` and ``mem_get_info``, and a CUDA graph captured before a cycle replayed
  after it.
- Probes, each in fresh processes under a timeout: ``nccl2``, ``NCCL_CUMEM_ENABLE=0`` and split
  sharing (the package must refuse, naming why), and last a raw collective on a suspended
  communicator, to record what the guard prevents.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

GROUPS = 8  # subgroups over every rank besides WORLD (Megatron makes about 20)
WARM_FLOATS = 64 * 2**20  # 256 MB per warm-up all_reduce: enough to open every protocol
CYCLES = 3


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300] if text else ''}"


def rank_main(rank: int, size: int, port: int, probe: str, queue: Any) -> None:
    """One rank of one run; puts a dict of what it measured on ``queue``."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", 0)
    out: dict[str, Any] = {"rank": rank, "size": size, "probe": probe}
    package = probe.startswith("package")
    if probe.startswith("package-refusal"):
        _refusal(rank, size, port, queue, probe)
        return
    try:
        torch.cuda.set_device(0)
        backend = "nccl2" if probe in ("raw-nccl2", "package-nccl2") else "nccl"
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=size,
            timeout=datetime.timedelta(seconds=60),
            device_id=device,
        )
        if package:
            _package(rank, size, device, out)
        else:
            _raw(rank, size, device, probe, out)
    except Exception as error:
        out["error"] = _line(error)
    queue.put(out)
    try:
        dist.destroy_process_group()
    except Exception as error:
        out["teardown_error"] = _line(error)


def _groups(size: int) -> list[Any]:
    import torch.distributed as dist

    return [dist.new_group(list(range(size))) for _ in range(GROUPS)]


def _warm(groups: list[Any], rank: int, size: int, device: Any) -> None:
    import torch
    import torch.distributed as dist

    x = torch.ones(WARM_FLOATS, device=device)
    for group in groups:
        dist.all_reduce(x, group=group)
        y = torch.empty(x.numel() * size, device=device)
        dist.all_gather_into_tensor(y, x, group=group)
        if size == 2:
            peer = 1 - rank
            ops = [
                dist.P2POp(dist.isend, x[:1024], peer, group),
                dist.P2POp(dist.irecv, torch.empty(1024, device=device), peer, group),
            ]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
    del x
    torch.cuda.synchronize()


def _correct(groups: list[Any], rank: int, size: int, device: Any) -> bool:
    import torch
    import torch.distributed as dist

    ok = True
    for group in groups:
        t = torch.full((1024,), float(rank + 1), device=device)
        dist.all_reduce(t, group=group)
        ok &= bool(torch.all(t == size * (size + 1) / 2).item())
        b = torch.full((8,), float(rank), device=device)
        dist.broadcast(b, 0, group=group)
        ok &= bool(torch.all(b == 0).item())
    torch.cuda.synchronize()
    return ok


def _free_mib(control: Any, device: Any) -> float:
    import torch
    import torch.distributed as dist

    dist.barrier(group=control)  # mem_get_info is device-wide: read it when every rank is done
    return torch.cuda.mem_get_info(device)[0] / 2**20


def _raw(rank: int, size: int, device: Any, probe: str, out: dict[str, Any]) -> None:
    """torch's own API, nothing of the package: the facts the mode rests on."""
    import torch
    import torch.distributed as dist

    control = dist.new_group(backend="gloo")
    groups = [dist.group.WORLD, *_groups(size)]
    backends = [g._get_backend(device) for g in groups]
    _warm(groups, rank, size, device)
    out["stats_awake"] = [dict(b.memory_stats()) for b in backends]
    cycles = []
    for _ in range(CYCLES if probe.startswith("raw-main") or probe == "raw-nccl2" else 1):
        cycle: dict[str, Any] = {"free_before": _free_mib(control, device)}
        started = time.perf_counter()
        for b in backends:  # the same order on every rank
            b.suspend()
        cycle["suspend_ms"] = (time.perf_counter() - started) * 1e3
        cycle["free_asleep"] = _free_mib(control, device)
        cycle["stats_asleep"] = [dict(b.memory_stats()) for b in backends]
        if probe == "raw-collective-while-suspended":
            out["collective_while_suspended"] = "started"
            dist.all_reduce(torch.ones(8, device=device), group=groups[1])
            torch.cuda.synchronize()
            out["collective_while_suspended"] = "returned"
        started = time.perf_counter()
        for b in backends:
            b.resume()
        torch.cuda.synchronize()
        cycle["resume_ms"] = (time.perf_counter() - started) * 1e3
        cycle["free_resumed"] = _free_mib(control, device)
        cycle["correct_after_resume"] = _correct(groups, rank, size, device)
        cycles.append(cycle)
    out["cycles"] = cycles
    try:
        backends[1].resume()
        out["resume_while_awake"] = "no error"
    except Exception as error:
        out["resume_while_awake"] = _line(error)
    # Against destroy + re-create + first collective, the cost the package pays otherwise.
    x = torch.ones(1024, device=device)
    dist.barrier(group=control)
    started = time.perf_counter()
    for group in groups[1:]:
        dist.destroy_process_group(group)
    torch.cuda.synchronize()
    destroyed = time.perf_counter()
    fresh = _groups(size)
    for group in fresh:
        dist.all_reduce(x, group=group)
    torch.cuda.synchronize()
    out["destroy_ms"] = (destroyed - started) * 1e3
    out["recreate_first_collective_ms"] = (time.perf_counter() - destroyed) * 1e3


def _package(rank: int, size: int, device: Any, out: dict[str, Any]) -> None:
    """The package's suspend mode, activated by the gate at start-up."""
    import torch
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    out["patched_at_start"] = rpg.is_patched()
    out["mode"] = rpg.get_reload_mode()
    rpg.register_default_process_group()
    control = dist.new_group(backend="gloo")  # left awake by the mode
    groups = _groups(size)
    world = dist.group.WORLD
    everyone = [world, *groups]
    _warm(everyone, rank, size, device)
    out["types"] = sorted({type(g).__name__ for g in everyone})
    # A CUDA graph captured before the cycles, replayed after them.
    t = torch.ones(1024, device=device)
    stream = torch.cuda.Stream()
    graph = None
    try:
        dist.all_reduce(t, group=groups[0])
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            dist.all_reduce(t, group=groups[0])
    except Exception as error:
        out["graph_capture"] = _line(error)
    cycles = []
    for _ in range(CYCLES):
        cycle: dict[str, Any] = {"free_before": _free_mib(control, device)}
        started = time.perf_counter()
        rpg.destroy_process_groups()
        cycle["destroy_ms"] = (time.perf_counter() - started) * 1e3
        cycle["free_asleep"] = _free_mib(control, device)
        cycle["world_same_object"] = dist.group.WORLD is world
        try:
            dist.all_reduce(torch.ones(8, device=device), group=groups[1])
            cycle["cuda_collective_asleep"] = "no error: THE GUARD DID NOT FIRE"
        except Exception as error:
            cycle["cuda_collective_asleep"] = _line(error)
        c = torch.ones(4)
        dist.all_reduce(c, group=control)
        cycle["gloo_asleep"] = c.tolist()
        started = time.perf_counter()
        rpg.reload_process_groups()
        cycle["reload_ms"] = (time.perf_counter() - started) * 1e3
        cycle["free_resumed"] = _free_mib(control, device)
        cycle["correct_after_resume"] = _correct(everyone, rank, size, device)
        cycle["report"] = rpg.last_cycle_report().to_dict()
        cycles.append(cycle)
    out["cycles"] = cycles
    if graph is not None:
        t.fill_(1.0)
        graph.replay()
        torch.cuda.synchronize()
        out["graph_replay_after_cycles_ok"] = bool(torch.all(t == size).item())


def _refusal(rank: int, size: int, port: int, queue: Any, probe: str) -> None:
    """In strict suspend mode, a setting that makes suspend refuse must be refused up front."""
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    out: dict[str, Any] = {"rank": rank, "probe": probe}
    try:
        import torch

        torch.cuda.set_device(0)
        dist.init_process_group(
            "nccl",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=size,
            timeout=datetime.timedelta(seconds=60),
            device_id=torch.device("cuda", 0),
        )
        try:
            rpg.register_default_process_group()
            out["refused"] = "no error"
        except Exception as error:
            out["refused"] = _line(error)
    except Exception as error:
        out["error"] = _line(error)
    queue.put(out)


def run(size: int, probe: str, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """One probe in fresh processes; a hang or a crash is recorded, never propagated."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import sys, json, multiprocessing as mp; sys.path.insert(0, {here!r})\n"
        "import gpu_suspend as m\n"
        "if __name__ == '__main__':\n"
        "    ctx = mp.get_context('spawn'); q = ctx.Queue(); port = m._port()\n"
        f"    ps = [ctx.Process(target=m.rank_main, args=(r, {size}, port, {probe!r}, q))"
        f" for r in range({size})]\n"
        "    [p.start() for p in ps]; res = []\n"
        "    for _ in ps:\n"
        "        try: res.append(q.get(timeout=" + repr(timeout) + "))\n"
        "        except Exception: res.append({'error': 'no result (hang or crash)'})\n"
        "    [p.join(5) for p in ps]; [p.kill() for p in ps if p.is_alive()]\n"
        "    print('RESULT' + json.dumps({'exitcodes': [p.exitcode for p in ps], 'ranks': res}))\n"
    )
    environment = {**os.environ, **env}
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout + 30,
            check=False,
        )
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT")), None)
        result = json.loads(line[6:]) if line else {"error": f"no result, exit {done.returncode}"}
        result["stderr_tail"] = done.stderr[-1500:]
    except subprocess.TimeoutExpired:
        result = {"error": f"timed out after {timeout + 30:.0f} s"}
    result.update(size=size, probe=probe, env=env, wall_s=round(time.perf_counter() - started, 1))
    return result


def plan(quick: bool) -> list[tuple[int, str, dict[str, str]]]:
    """The runs, cheapest and most informative first; the raw undefined behaviour last."""
    import torch.distributed as dist

    multi = {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}
    gate = {"SLIME_RELOADABLE_PG": "1", "SLIME_RELOADABLE_PG_MODE": "suspend"}
    runs = [
        (1, "raw-main", {}),
        (2, "raw-main", multi),
        (2, "package", {**multi, **gate}),
    ]
    if quick:
        return runs
    if "nccl2" in dist.Backend.backend_list:
        runs.append((2, "raw-nccl2", multi))
    for name, value in (("NCCL_CUMEM_ENABLE", "0"), ("NCCL_COMM_SPLIT_SHARE_RESOURCES", "1")):
        runs.append((2, f"package-refusal {name}={value}", {**multi, **gate, name: value}))
    runs.append((2, "raw-collective-while-suspended", multi))  # last: may crash or hang
    return runs


def verdicts(results: dict[str, Any]) -> list[str]:
    """What the runs show against the mode's promises; empty when every promise held."""
    failures = []
    for run_ in results["runs"]:
        label = f"{run_['probe']} (world size {run_['size']})"
        ranks = run_.get("ranks") or []
        if run_.get("error") or any(r.get("error") for r in ranks):
            if run_["probe"] != "raw-collective-while-suspended":
                failures.append(f"{label}: {run_.get('error') or [r.get('error') for r in ranks]}")
            continue
        for r in ranks:
            for cycle in r.get("cycles", ()):
                if not cycle.get("correct_after_resume", True):
                    failures.append(f"{label}: wrong results after a resume")
                if run_["probe"] == "package":
                    if not cycle.get("world_same_object"):
                        failures.append(f"{label}: WORLD changed across a cycle")
                    if "GroupSuspendedError" not in cycle.get("cuda_collective_asleep", ""):
                        failures.append(f"{label}: {cycle.get('cuda_collective_asleep')}")
                    if cycle.get("free_asleep", 0) <= cycle.get("free_before", 0):
                        failures.append(f"{label}: suspending freed no GPU memory")
            refusal = run_["probe"].startswith("package-refusal")
            if refusal and "cannot" not in r.get("refused", ""):
                failures.append(f"{label}: not refused ({r.get('refused')})")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="suspend.json")
    parser.add_argument("--quick", action="store_true", help="the three main runs only")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds per run")
    args = parser.parse_args(argv)
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available() or not dist.is_nccl_available():
        print("gpu_suspend: no CUDA device or no NCCL here; nothing was checked", file=sys.stderr)
        return 2
    nccl = getattr(dist, "ProcessGroupNCCL", None)
    results: dict[str, Any] = {
        "info": {
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0),
            "nccl_build": getattr(nccl, "get_build_nccl_version", lambda: None)(),
            "nccl_runtime": getattr(nccl, "get_runtime_nccl_version", lambda: None)(),
        },
        "runs": [],
    }
    for size, probe, env in plan(args.quick):
        results["runs"].append(run(size, probe, env, args.timeout))
        results["failures"] = verdicts(results)
        with open(args.out, "w", encoding="utf-8") as handle:  # after every run
            json.dump(results, handle, indent=1)
        last = results["runs"][-1]
        print(
            f"gpu_suspend: {probe} at world size {size}: {last['wall_s']} s, "
            + (f"error: {str(last.get('error'))[:160]}" if last.get("error") else "done"),
            flush=True,
        )
    for failure in results["failures"]:
        print(f"gpu_suspend FAILED: {failure}")
    print("gpu_suspend: OK" if not results["failures"] else "gpu_suspend: FAILED")
    return 0 if not results["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
