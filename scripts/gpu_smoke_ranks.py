"""The rank programs of `scripts/gpu_smoke.py`: each rank runs this file in a fresh interpreter.

Not an entry point: ``gpu_smoke.py`` starts it with ``--rank-program NAME`` and the run's
arguments, each rank in a process session of its own. A rank reports to the script through
tagged JSON lines on stdout (``data`` merged into its record as it arrives, so a rank killed
midway keeps what it said; ``check`` verdicts; ``error``), and ends itself if the script dies.
Nothing here imports torch before a program starts.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import importlib.util
import json
import os
import platform
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_smoke import (
    GATE,
    GROUPS,
    HOST,
    IMPLEMENTATIONS,
    MEM_STATS,
    MODE_ENV,
    NCCL_SUSPEND_MEM,
    ROOT,
    SUSPEND_SYMBOLS,
    TAG,
    GiB,
    MiB,
    error_line,
)


@dataclass
class Ctx:
    """One rank's arguments."""

    program: str
    rank: int
    world_size: int
    port: int
    deadline: float
    rehearse: bool
    method: str | None
    backend: str | None
    cycles: int

    @property
    def init_method(self) -> str:
        return f"tcp://{HOST}:{self.port}"

    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=max(10.0, self.deadline))


def _emit(kind: str, **fields: Any) -> None:
    sys.stdout.write(TAG + json.dumps({"type": kind, **fields}, default=str) + "\n")
    sys.stdout.flush()


def _data(**fields: Any) -> None:
    """Data for the parent, merged into this rank's record as it arrives (a kill keeps it)."""
    _emit("data", **fields)


def _check(name: str, ok: bool | None, detail: str) -> bool:
    """A check's verdict; ``ok=None`` records it as skipped (``detail`` says why)."""
    status = "skipped" if ok is None else ("ok" if ok else "failed")
    _emit("check", name=name, status=status, detail=detail)
    return bool(ok)


def _orphan_guard(parent: int, deadline: float) -> None:
    """End this rank if the script that started it dies, or long after its deadline."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    give_up = time.monotonic() + deadline + 30.0

    def watch() -> None:
        while True:
            if os.getppid() != parent or time.monotonic() > give_up:
                os._exit(137)
            time.sleep(0.5)

    if os.getppid() != parent:
        os._exit(137)
    threading.Thread(target=watch, daemon=True, name="gpu_smoke orphan guard").start()


def _stand_in() -> Any:
    """``tests/support/suspendable.py`` (NCCL's suspend protocol on gloo), loaded by its path."""
    name = "gpu_smoke_suspendable"
    if name in sys.modules:
        return sys.modules[name]
    path = ROOT / "tests" / "support" / "suspendable.py"
    if not path.is_file():
        raise FileNotFoundError(f"no {path}: the rehearsal needs the repository's stand-in")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _device(ctx: Ctx) -> Any:
    import torch

    if ctx.rehearse:
        return torch.device("cpu")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    free, total = torch.cuda.mem_get_info(device)
    _data(memory_at_start={"free": free, "total": total})
    return device


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _activation() -> dict[str, Any]:
    """Whether the ``.pth`` activated the package in this process (before torch is touched)."""
    try:
        import reloadpg_autopatch as rpg
        from reloadpg_autopatch._startup import bootstrap
    except Exception as error:
        return {"importable": False, "error": error_line(error), "activated": False}
    status = bootstrap.status()
    import torch.distributed  # noqa: F401 - with the .pth active, this is what patches

    patched = bool(rpg.is_patched())
    return {
        "importable": True,
        "version": rpg.__version__,
        "file": rpg.__file__,
        "started_by_site": status.get("source") == "site",
        "bootstrap": status,
        "patched": patched,
        "activated": status.get("source") == "site" and patched,
    }


def decode_nccl_version(code: int) -> tuple[int, int, int]:
    """``ncclGetVersion``'s integer as (major, minor, patch); nccl.h's NCCL_VERSION, inverted."""
    if code >= 10000:  # 2.9 and later: X * 10000 + Y * 100 + Z
        return code // 10000, code % 10000 // 100, code % 100
    return code // 1000, code % 1000 // 100, code % 100


# ---- preflight --------------------------------------------------------------------------------


def nccl_library() -> dict[str, Any]:
    """The libnccl this process loaded (torch's), its version and its suspend symbols."""
    paths: list[str] = []
    with contextlib.suppress(OSError), open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            path = line.split()[-1] if line.strip() else ""
            if "/" in path and "libnccl" in path.rsplit("/", 1)[-1] and path not in paths:
                paths.append(path)
    tried = []
    for path in [*paths, None]:  # None: whatever the process exports (a static NCCL)
        try:
            lib = ctypes.CDLL(path)
            get = lib.ncclGetVersion
        except (OSError, AttributeError) as error:
            tried.append(f"{path}: {error_line(error)}")
            continue
        code = ctypes.c_int(0)
        result = get(ctypes.byref(code))
        if result != 0:
            tried.append(f"{path}: ncclGetVersion returned {result}")
            continue
        return {
            "path": path or "(symbols of the process)",
            "code": code.value,
            "version": list(decode_nccl_version(code.value)),
            "symbols": {name: hasattr(lib, name) for name in SUSPEND_SYMBOLS},
        }
    return {"path": None, "version": None, "symbols": {}, "tried": tried}


def c_api_probe(found: dict[str, Any]) -> dict[str, Any]:
    """Call the suspend API with a null communicator: NCCL must answer "invalid argument".

    It proves, without a GPU, that the symbols resolve and take these arguments, so that the
    ctypes path is not first called on the one GPU run.
    """
    missing = [s for s in SUSPEND_SYMBOLS if not (found.get("symbols") or {}).get(s)]
    if found.get("path") is None or missing:
        return {"callable": False, "why": f"no libnccl with {', '.join(missing) or 'them'}"}
    path = found["path"] if found["path"] != "(symbols of the process)" else None
    library = NcclLibrary(path)
    value = ctypes.c_uint64(0)
    calls = {
        "ncclCommMemStats": lambda: library.lib.ncclCommMemStats(None, 0, ctypes.byref(value)),
        "ncclCommSuspend": lambda: library.lib.ncclCommSuspend(None, NCCL_SUSPEND_MEM),
        "ncclCommResume": lambda: library.lib.ncclCommResume(None),
    }
    answers = {}
    for name, call in calls.items():
        code = call()
        text = (library.lib.ncclGetErrorString(code) or b"").decode(errors="replace")
        answers[name] = f"{code}: {text}"
    invalid_argument = 4  # ncclInvalidArgument
    ok = all(a.startswith(f"{invalid_argument}:") for a in answers.values())
    return {"callable": ok, "null_communicator": answers}


def nccl_implementation(dist: Any) -> dict[str, Any]:
    """Which class a plain ``nccl`` group gets, and whether nccl2 can be had (entry points)."""
    backend = dist.Backend
    ensure = getattr(backend, "_ensure_backend_registered", None)
    out: dict[str, Any] = {"entry_points": ensure is not None}
    for name in ("nccl", "nccl2", "nccl-legacy"):
        if ensure is not None:
            try:
                ensure(name)
            except Exception as error:
                out[f"{name}_registration_error"] = error_line(error)
    plugins = getattr(backend, "_plugins", {}) or {}
    plugin = plugins.get("NCCL")
    if plugin is None:
        out["nccl"] = "classic" if dist.is_nccl_available() else None
        out["nccl_how"] = "built into torch (no plugin registration)"
    else:
        creator = getattr(plugin, "creator_fn", None) or plugin[0]
        name = getattr(creator, "__name__", repr(creator))
        out["nccl"] = "nccl2" if "nccl2" in name else "classic"
        flag = os.environ.get("TORCH_DIST_USE_NCCL2")
        out["nccl_how"] = f"registered creator {name} (TORCH_DIST_USE_NCCL2={flag!r})"
    out["nccl2_available"] = "NCCL2" in plugins or "nccl2" in list(backend.backend_list)
    out["nccl_legacy_available"] = "NCCL-LEGACY" in plugins
    out["nccl2_how"] = (
        "registered from its entry point (torch.distributed.backends)"
        if "NCCL2" in plugins
        else "absent"
    )
    return out


def _rank_preflight(ctx: Ctx) -> None:
    _data(
        python=sys.version.split()[0],
        executable=sys.executable,
        platform=platform.platform(),
        rank_started_with={GATE: os.environ.get(GATE), MODE_ENV: os.environ.get(MODE_ENV)},
    )
    try:
        import torch
        import torch.distributed as dist
    except Exception as error:
        _data(torch=None, torch_error=error_line(error))
        _check("torch imports", False, error_line(error))
        return
    package = _activation()
    _data(package=package)
    _check(
        "the package activated by the gate alone",
        package["activated"],
        f"started by site: {package.get('started_by_site')}, patched: {package.get('patched')}",
    )
    c10d = torch._C._distributed_c10d
    nccl_class = getattr(c10d, "ProcessGroupNCCL", None)
    _data(
        torch={
            "version": torch.__version__,
            "cuda_build": torch.version.cuda,
            "distributed": dist.is_available(),
            "nccl_available": bool(dist.is_available() and dist.is_nccl_available()),
        },
        capabilities={
            "backend_suspend": all(
                hasattr(c10d.Backend, n) for n in ("suspend", "resume", "memory_stats")
            ),
            "reconfigure": hasattr(dist.ProcessGroup, "reconfigure"),
            "pre_hooks": hasattr(dist.ProcessGroup, "register_pre_hook"),
            "comm_ptr": nccl_class is not None and hasattr(nccl_class, "_comm_ptr"),
            "mem_pool": hasattr(torch.cuda, "MemPool"),
        },
    )
    nccl: dict[str, Any] = {"library": nccl_library()}
    try:
        nccl["c_api"] = c_api_probe(nccl["library"])
    except Exception as error:
        nccl["c_api"] = {"callable": False, "why": error_line(error)}
    with contextlib.suppress(Exception):
        nccl["build"] = list(torch.cuda.nccl.version())
    for key, getter in (
        ("torch_build", "get_build_nccl_version"),
        ("torch_runtime", "get_runtime_nccl_version"),
    ):
        call = getattr(nccl_class, getter, None)
        with contextlib.suppress(Exception):
            nccl[key] = list(call()) if call else None
    _data(nccl=nccl, implementation=nccl_implementation(dist))
    cuda: dict[str, Any] = {"available": bool(torch.cuda.is_available())}
    if cuda["available"]:
        props = torch.cuda.get_device_properties(0)
        cuda.update(
            device_count=torch.cuda.device_count(),
            name=props.name,
            total_bytes=props.total_memory,
            capability=list(torch.cuda.get_device_capability(0)),
        )
        with contextlib.suppress(Exception):
            cuda["driver_api"] = torch._C._cuda_getDriverVersion()
    _data(cuda=cuda)
    found = importlib.util.find_spec("megatron") is not None
    megatron = {"installed": found, "version": None}
    if found:
        from importlib.metadata import PackageNotFoundError, version

        with contextlib.suppress(PackageNotFoundError):
            megatron["version"] = version("megatron-core")
    _data(megatron=megatron)
    if ctx.rehearse:
        stand_in = _stand_in()
        _data(
            stand_in={
                "path": stand_in.__file__,
                "claims_nccl": stand_in.NCCL_VERSION,
                "python_backend": stand_in.python_backend_available(),
            }
        )
    # Last, as it may hang: a one-rank group of each kind, and the class torch made for it.
    if ctx.rehearse or (cuda["available"] and dist.is_nccl_available()):
        _data(made=_made_groups(ctx, torch, dist))


def _made_groups(ctx: Ctx, torch: Any, dist: Any) -> dict[str, Any]:
    device = _device(ctx)
    backend = "gloo" if ctx.rehearse else "nccl"
    made: dict[str, Any] = {}
    kwargs = {} if ctx.rehearse else {"device_id": device}
    dist.init_process_group(
        backend, store=dist.HashStore(), rank=0, world_size=1, timeout=ctx.timeout(), **kwargs
    )
    names = [backend] + ([] if ctx.rehearse else ["nccl2"])
    for name in names:
        try:
            group = dist.group.WORLD if name == backend else dist.new_group([0], backend=name)
            native = getattr(group, "group", group)  # behind the package's wrapper, if any
            impl = native._get_backend(device)
            t = torch.ones(1, device=device)
            dist.all_reduce(t, group=group)
            _sync(device)
            made[name] = {"class": type(impl).__name__, "all_reduce": t.item()}
        except Exception as error:
            made[name] = {"error": error_line(error)}
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    return made


def _implementation(ctx: Ctx, group: Any, device: Any) -> dict[str, Any]:
    """Which implementation served ``group`` on ``device`` (the package's reading of what the
    backend answers), what was asked for, and the variable that chose what ``nccl`` means."""
    from reloadpg_autopatch.groups import implementations

    native = getattr(group, "group", None) or group  # behind the package's wrapper, if any
    try:
        found = implementations.describe(native._get_backend(device))
    except Exception as error:
        found = {"error": error_line(error)}
    found.update(
        asked=ctx.backend,
        variable=implementations.VARIABLE,
        value=os.environ.get(implementations.VARIABLE),
    )
    _data(implementation=found)
    return found


def _check_implementation(ctx: Ctx, found: dict[str, Any]) -> None:
    """On a GPU, ``nccl-legacy`` is the classic backend and the ``nccl`` pass is nccl2 (the
    plan sets the variable where ``nccl`` is not nccl2 by default)."""
    want = {"nccl-legacy": "classic", "nccl": "nccl2"}.get(str(ctx.backend))
    if ctx.rehearse or want is None:
        _check("the implementation asked for", None, f"rehearsal: {found}")
        return
    _check("the implementation asked for", found.get("implementation") == want, str(found))


# ---- NCCL's suspend, raw ----------------------------------------------------------------------


class TorchComm:
    """torch's ``Backend.suspend`` / ``resume`` / ``memory_stats`` (and the stand-in's)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def suspend(self) -> None:
        self.backend.suspend()

    def resume(self) -> None:
        self.backend.resume()

    def stats(self) -> dict[str, int]:
        return {k: int(v) for k, v in dict(self.backend.memory_stats()).items()}


class NcclLibrary:
    """NCCL's suspend API through ctypes (nccl.h, 2.29.7 and later)."""

    def __init__(self, path: str | None) -> None:
        lib = ctypes.CDLL(path)
        lib.ncclCommSuspend.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.ncclCommSuspend.restype = ctypes.c_int
        lib.ncclCommResume.argtypes = [ctypes.c_void_p]
        lib.ncclCommResume.restype = ctypes.c_int
        lib.ncclCommMemStats.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_uint64),
        ]
        lib.ncclCommMemStats.restype = ctypes.c_int
        lib.ncclGetErrorString.argtypes = [ctypes.c_int]
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        self.lib = lib

    def check(self, result: int, call: str) -> None:
        if result != 0:
            text = self.lib.ncclGetErrorString(result) or b""
            raise RuntimeError(f"{call} returned {result}: {text.decode(errors='replace')}")


class CComm:
    """One communicator torch made, driven through NCCL's C API (torch's mutex bypassed: this
    script issues nothing else on it meanwhile)."""

    def __init__(self, library: NcclLibrary, pointer: int) -> None:
        if not pointer:
            raise RuntimeError("torch returned a null communicator pointer")
        self.library, self.pointer = library, ctypes.c_void_p(pointer)

    def suspend(self) -> None:
        lib = self.library
        lib.check(lib.lib.ncclCommSuspend(self.pointer, NCCL_SUSPEND_MEM), "ncclCommSuspend")

    def resume(self) -> None:
        self.library.check(self.library.lib.ncclCommResume(self.pointer), "ncclCommResume")

    def stats(self) -> dict[str, int]:
        out = {}
        for key, stat in MEM_STATS.items():
            value = ctypes.c_uint64(0)
            result = self.library.lib.ncclCommMemStats(self.pointer, stat, ctypes.byref(value))
            self.library.check(result, f"ncclCommMemStats({key})")
            out[key] = int(value.value)
        return out


def _comms(ctx: Ctx, groups: list[Any], device: Any) -> list[Any]:
    if ctx.method == "ctypes":
        found = nccl_library()
        library = NcclLibrary(
            found["path"] if found["path"] != "(symbols of the process)" else None
        )
        return [CComm(library, int(g._get_backend(device)._comm_ptr())) for g in groups]
    return [TorchComm(g._get_backend(device)) for g in groups]


def _raw_world(ctx: Ctx) -> tuple[Any, Any, Any, Any]:
    """WORLD on NCCL with eager init (a GPU) or on the stand-in (the rehearsal)."""
    import torch
    import torch.distributed as dist

    device = _device(ctx)
    stand_in = None
    if ctx.rehearse:
        stand_in = _stand_in()
        name = stand_in.NAME_B if ctx.method == "stand-in B" else stand_in.NAME_A
        dist.init_process_group(
            name,
            init_method=ctx.init_method,
            rank=ctx.rank,
            world_size=ctx.world_size,
            timeout=ctx.timeout(),
        )
    else:
        dist.init_process_group(
            "nccl",
            init_method=ctx.init_method,
            rank=ctx.rank,
            world_size=ctx.world_size,
            timeout=ctx.timeout(),
            device_id=device,  # eager: p2p rides the main communicator, which suspend frees
        )
    return torch, dist, device, stand_in


def _free_bytes(device: Any, control: Any, stand_in: Any) -> int:
    """Free device memory when every rank got here (mem_get_info is device-wide)."""
    import torch
    import torch.distributed as dist

    _sync(device)
    if control is not None:
        dist.barrier(group=control)
    if stand_in is not None:
        return int(stand_in.device_memory()[0])
    return int(torch.cuda.mem_get_info(device)[0])


def _warm(groups: list[Any], ctx: Ctx, device: Any) -> None:
    """Collectives on every group, so that every communicator holds its buffers."""
    import torch
    import torch.distributed as dist

    x = torch.ones(1024 if ctx.rehearse else 16 * MiB, device=device)  # 64 MB on a GPU
    for group in groups:
        dist.all_reduce(x, group=group)
        y = torch.empty(x.numel() * ctx.world_size, device=device)
        dist.all_gather_into_tensor(y, x, group=group)
        if ctx.world_size == 2:
            peer = 1 - ctx.rank
            ops = [
                dist.P2POp(dist.isend, x[:1024], peer, group),
                dist.P2POp(dist.irecv, torch.empty(1024, device=device), peer, group),
            ]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
    del x
    _sync(device)


def _correct(groups: list[Any], ctx: Ctx, device: Any) -> bool:
    import torch
    import torch.distributed as dist

    ok = True
    size = ctx.world_size
    for group in groups:
        t = torch.full((1024,), float(ctx.rank + 1), device=device)
        dist.all_reduce(t, group=group)
        ok &= bool(torch.all(t == size * (size + 1) / 2).item())
        b = torch.full((8,), float(ctx.rank), device=device)
        dist.broadcast(b, 0, group=group)
        ok &= bool(torch.all(b == 0).item())
    _sync(device)
    return ok


def _ms(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return round((time.perf_counter() - started) * 1e3, 3)


def _rank_nccl_suspend(ctx: Ctx) -> None:
    torch, dist, device, stand_in = _raw_world(ctx)
    size = ctx.world_size
    control = dist.new_group(backend="gloo")
    groups = [dist.group.WORLD] + [dist.new_group(list(range(size))) for _ in range(GROUPS)]
    _warm(groups, ctx, device)
    comms = _comms(ctx, groups, device)
    awake = [c.stats() for c in comms]
    suspendable = sum(s["suspend"] for s in awake)
    _data(method=ctx.method, groups=len(groups), stats_awake=awake)
    cycles = []
    for number in range(1, 3):
        cycle: dict[str, Any] = {
            "cycle": number,
            "free_before": _free_bytes(device, control, stand_in),
        }
        _sync(device)
        cycle["suspend_ms"] = [_ms(c.suspend) for c in comms]  # the same order on every rank
        cycle["free_asleep"] = _free_bytes(device, control, stand_in)
        cycle["stats_asleep"] = [c.stats() for c in comms]
        cycle["resume_ms"] = [_ms(c.resume) for c in comms]
        _sync(device)
        cycle["free_resumed"] = _free_bytes(device, control, stand_in)
        cycle["stats_resumed"] = [c.stats() for c in comms]
        cycle["correct_after_resume"] = _correct(groups, ctx, device)
        cycles.append(cycle)
        _data(cycles=cycles)
        _check(
            f"cycle {number}: every communicator said suspended, then awake",
            all(s["suspended"] == 1 for s in cycle["stats_asleep"])
            and all(s["suspended"] == 0 for s in cycle["stats_resumed"]),
            f"asleep {[s['suspended'] for s in cycle['stats_asleep']]}, resumed "
            f"{[s['suspended'] for s in cycle['stats_resumed']]}",
        )
        _check(f"cycle {number}: right results after the resume", cycle["correct_after_resume"], "")
        freed = cycle["free_asleep"] - cycle["free_before"]
        _check(
            f"cycle {number}: the device saw memory freed",
            freed > 0 if suspendable >= 2 * MiB else None,
            f"{freed / MiB:.1f} MiB freed (mem_get_info), NCCL counts {suspendable / MiB:.1f} "
            "MiB suspendable"
            + ("" if suspendable >= 2 * MiB else ": under 2 MiB, the driver may not show it"),
        )
    # Against destroy + re-create + first collective: what the wrapper mode pays instead.
    before = _free_bytes(device, control, stand_in)
    started = time.perf_counter()
    for group in groups[1:]:
        dist.destroy_process_group(group)
    _sync(device)
    destroy_ms = (time.perf_counter() - started) * 1e3
    after = _free_bytes(device, control, stand_in)
    started = time.perf_counter()
    fresh = [dist.new_group(list(range(size))) for _ in range(GROUPS)]
    x = torch.ones(1024, device=device)
    for group in fresh:
        dist.all_reduce(x, group=group)
    _sync(device)
    recreate_ms = (time.perf_counter() - started) * 1e3
    _check("right results on the re-created groups", _correct(fresh, ctx, device), "")
    first = cycles[0]
    _data(
        summary={
            "method": ctx.method,
            "world_size": size,
            "communicators": len(comms),
            "nccl_suspendable_bytes": suspendable,
            "nccl_persist_bytes": sum(s["persist"] for s in awake),
            "freed_by_suspend_bytes": first["free_asleep"] - first["free_before"],
            "suspend_ms": round(sum(first["suspend_ms"]), 3),
            "resume_ms": round(sum(first["resume_ms"]), 3),
            "suspend_ms_per_call": round(sum(first["suspend_ms"]) / len(comms), 3),
            "resume_ms_per_call": round(sum(first["resume_ms"]) / len(comms), 3),
            "destroy_ms": round(destroy_ms, 3),
            "freed_by_destroy_bytes": after - before,
            "recreate_first_collective_ms": round(recreate_ms, 3),
            "groups_destroyed": len(groups) - 1,
        }
    )
    dist.destroy_process_group()


def _rank_raw_asleep(ctx: Ctx) -> None:
    """A collective on a suspended communicator: what the package's guard prevents. Last."""
    if ctx.rehearse:
        stand_in = _stand_in()
        ctx.method = "stand-in B" if stand_in.python_backend_available() else "stand-in"
    torch, dist, device, stand_in = _raw_world(ctx)
    group = dist.new_group([0])
    _warm([group], ctx, device)
    comm = _comms(ctx, [group], device)[0]
    comm.suspend()
    _data(outcome="started", method=ctx.method)
    try:
        t = torch.ones(8, device=device)
        dist.all_reduce(t, group=group)
        _sync(device)
        _data(outcome=f"returned {t[0].item()}")
    except Exception as error:
        _data(outcome=error_line(error))
    _check("observed (no verdict: undefined behaviour)", None, "recorded in data.outcome")
    os._exit(0)  # destroying a suspended communicator is its own question; not asked here


# ---- the package ------------------------------------------------------------------------------


def _rank_demo(ctx: Ctx) -> None:
    """The package's demo rank itself (``tools.demo_rank``), joined through rank 0's store."""
    from reloadpg_autopatch.tools import demo_rank

    args = argparse.Namespace(
        rank=ctx.rank,
        world_size=ctx.world_size,
        host=HOST,
        port=ctx.port,
        store_host=ctx.rank == 0,
        launched=True,
        cycles=ctx.cycles,
        backend=ctx.backend,
        inject_failure=None,
        timeout=max(10.0, ctx.deadline),
    )
    demo_rank.run(args)


class _PretendMemory:
    """The rehearsal's device memory for the package's probe: always low, clears counted."""

    def __init__(self) -> None:
        self.total, self.free, self.cleared = 8 * GiB, 1 * GiB, 0

    def figures(self, _device: Any) -> Any:
        from reloadpg_autopatch import MemoryFigures

        return MemoryFigures(self.free, self.total, 0, self.total - self.free)

    def clear(self, _device: Any) -> None:
        self.cleared += 1


def _checks_backend(ctx: Ctx) -> str:
    """The backend a checks run starts WORLD on: the one asked for; in the rehearsal gloo for
    ``nccl``, and for ``nccl-legacy`` the stand-in that cannot reconfigure (variant B, torch
    2.14: the classic backend's answer), so that the refusal is rehearsed too."""
    if not ctx.rehearse:
        return str(ctx.backend)
    if ctx.backend == "nccl-legacy":
        stand_in = _stand_in()
        if stand_in.python_backend_available():
            return stand_in.NAME_B
    return "gloo"


def _reconfigurable(world: Any) -> bool:
    try:
        return bool(getattr(world, "supports_reconfigure", False))
    except Exception:
        return False


def _refused_in_place(ctx: Ctx, rpg: Any, dist: Any, found: dict[str, Any]) -> None:
    """Native mode on an implementation that cannot reconfigure: refused by name, up front."""
    try:
        rpg.register_default_process_group()
        dist.new_group(list(range(ctx.world_size)))
        refused = "no error"
    except Exception as error:
        refused = error_line(error)
    _data(in_place_refused=refused)
    _check(
        f"in place refused for {found.get('implementation')} (it cannot reconfigure)",
        refused.startswith("ModeRefusedError") and "reconfigure" in refused,
        refused,
    )
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def _rank_checks(ctx: Ctx) -> None:
    """Wrapper (or native) mode: WORLD, the guard, a memory pool and the cycle report."""
    import logging

    import torch
    import torch.distributed as dist

    package = _activation()
    _check("activated by the gate alone", package["activated"], str(package.get("bootstrap")))
    import reloadpg_autopatch as rpg

    device = _device(ctx)
    backend = _checks_backend(ctx)
    dist.init_process_group(
        backend,
        init_method=ctx.init_method,
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=ctx.timeout(),
    )
    in_place_pass = os.environ.get(MODE_ENV) == "native" and ctx.backend in IMPLEMENTATIONS
    if in_place_pass:  # which implementation ran, and the refusal where it cannot rebuild
        found = _implementation(ctx, dist.group.WORLD, device)
        _check_implementation(ctx, found)
        if not _reconfigurable(dist.group.WORLD):
            _refused_in_place(ctx, rpg, dist, found)
            return
    pretend = _PretendMemory() if ctx.rehearse else None
    if pretend is not None:
        rpg.set_memory_probe(pretend.figures, device_types=("cpu",), clear=pretend.clear)
    # On gloo, name gloo the accelerator so that WORLD is swapped as NCCL's WORLD is.
    rpg.register_default_process_group(accelerator_backends=(backend,) if ctx.rehearse else None)
    rpg.set_wrap_policy("all")
    group = dist.new_group(list(range(ctx.world_size)))
    one = torch.ones(1, device=device)
    dist.all_reduce(one, group=group)  # the communicator exists: a pool can be registered
    native = type(group) is dist.ProcessGroup
    _data(mode=rpg.get_reload_mode(), in_place=native, world_backend=str(dist.get_backend()))
    registered, pool, hook_calls = _pool_setup(ctx, torch, group, device)
    second = dist.new_group(list(range(ctx.world_size)))  # two groups: an order to keep
    made = [str(g.group_name) for g in (group, second)]
    released = _release_spy(torch, dist, second, device)

    def restore_pool(groups: list[Any]) -> None:  # what a framework's own hook would do
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
    total = pretend.total if pretend is not None else torch.cuda.mem_get_info(device)[1]
    rpg.set_memory_guard(min_free_gb=2 * total / GiB)  # always "low": the guard must act
    world_before = dist.group.WORLD
    world_backend = str(dist.get_backend())

    def free_now() -> tuple[int, int]:
        if pretend is not None:
            return pretend.free, 0
        _sync(device)
        return int(torch.cuda.mem_get_info(device)[0]), int(torch.cuda.memory_reserved(device))

    def fill_cache() -> tuple[int, int]:
        if pretend is None:
            cache = torch.empty(1 << 30, dtype=torch.uint8, device=device)  # 1 GiB, then cached
            del cache
        seen.clear()
        return free_now()

    cycles = []
    for number in (1, 2):
        cycle: dict[str, Any] = {"cycle": number}
        live, _ = free_now()
        rpg.destroy_process_groups()
        destroyed, _ = free_now()
        cycle.update(free_live=live, free_destroyed=destroyed)
        cycle["world_asleep"] = str(dist.get_backend())
        cycle["world_asleep_all_reduce"] = None
        if cycle["world_asleep"] == "gloo":  # the temporary WORLD (or gloo's own, in place)
            t = torch.ones(2)
            dist.all_reduce(t)
            cycle["world_asleep_all_reduce"] = t.tolist()
        cleared = pretend.cleared if pretend is not None else 0
        if native:
            before, reserved = fill_cache()
        rpg.reload_process_groups()
        if not native:
            before, reserved = fill_cache()
        x = torch.full((4,), 2.0, device=device)
        dist.all_reduce(x, group=group)
        _sync(device)
        after, reserved_after = free_now()
        y = torch.ones(1, device=device)
        dist.all_reduce(y)
        _sync(device)
        cycle.update(world_back=str(dist.get_backend()), world_all_reduce=y.item())
        acted = any("emptying the cache" in line for line in seen)
        if pretend is not None:
            acted = acted and pretend.cleared > cleared
            detail = f"the guard {'acted' if acted else 'did NOT act'} (clears {pretend.cleared})"
        else:
            acted = acted and after > before and reserved_after < reserved
            detail = (
                f"free {before / GiB:.2f} GiB before the guard, {after / GiB:.2f} GiB after it "
                f"(the guard {'acted' if acted else 'did NOT act'}); reserved "
                f"{reserved / GiB:.2f} -> {reserved_after / GiB:.2f} GiB"
            )
        _check(f"cycle {number}: the memory guard", acted, f"{detail}; all_reduce {x.tolist()}")
        # Behind a wrapper, WORLD sleeps as a temporary gloo WORLD that works on CPU tensors;
        # in place (native), it is torch's own WORLD throughout.
        asleep_ok = (
            cycle["world_asleep_all_reduce"] == [float(ctx.world_size)] * 2
            if cycle["world_asleep"] == "gloo" or not native
            else cycle["world_asleep"] == world_backend
        )
        _check(
            f"cycle {number}: WORLD {'kept in place' if native else 'swapped'} and back",
            asleep_ok
            and cycle["world_back"] == world_backend
            and y.item() == float(ctx.world_size),
            f"{world_backend} -> {cycle['world_asleep']} while asleep "
            f"(all_reduce {cycle['world_asleep_all_reduce']}) -> {cycle['world_back']}; "
            f"the same object after: {dist.group.WORLD is world_before}",
        )
        report = rpg.last_cycle_report().to_dict()
        cycle["report"] = report
        figures = report["memory"]
        present = all(figures[p] is not None for p in ("before_destroy", "after_destroy"))
        tolerance = 0 if pretend is not None else 256 * MiB
        close = present and (
            abs(figures["before_destroy"]["free"] - live) <= tolerance
            and abs(figures["after_destroy"]["free"] - destroyed) <= tolerance
        )
        _check(
            f"cycle {number}: the cycle report's figures against mem_get_info",
            close,
            "report free before/after destroy "
            + (
                f"{figures['before_destroy']['free'] / MiB:.0f} / "
                f"{figures['after_destroy']['free'] / MiB:.0f} MiB"
                if present
                else "missing"
            )
            + f", measured {live / MiB:.0f} / {destroyed / MiB:.0f} MiB; report says destroy "
            f"gave back {(report['freed_bytes'] or 0) / MiB:.0f} MiB",
        )
        if pretend is None and not native:
            _check(
                f"cycle {number}: destroy gave GPU memory back",
                destroyed > live,
                f"{(destroyed - live) / MiB:.0f} MiB (mem_get_info)",
            )
        _check_concert(number, cycle, made, released)
        cycles.append(cycle)
        _data(cycles=cycles)
    _check(
        "a reload hook ran once per reload",
        len(hook_calls) == 2,
        f"groups it was given per reload: {hook_calls}",
    )
    _pool_check(
        ctx,
        torch=torch,
        dist=dist,
        group=group,
        device=device,
        registered=registered,
        pool=pool,
        hook_calls=hook_calls,
        native=native,
    )
    rpg.set_memory_guard()
    first = cycles[0]
    _data(
        summary={
            "mode": rpg.get_reload_mode(),
            "backend": world_backend,
            "freed_by_destroy_bytes": first["free_destroyed"] - first["free_live"],
            "report_freed_bytes": first["report"]["freed_bytes"],
            "destroy_ms": (first["report"]["destroy"] or {}).get("total_ms"),
            "reload_ms": (first["report"]["reload"] or {}).get("total_ms"),
        }
    )
    dist.destroy_process_group()


def _release_spy(torch: Any, dist: Any, group: Any, device: Any) -> list[Any] | None:
    """Megatron's ``fused_a2a.nccl_ep_finalize`` replaced by a spy that runs a collective on
    ``group`` (so it ran while that group's communicator lived) and records it; None where
    megatron-core is not installed."""
    if importlib.util.find_spec("megatron") is None:
        return None
    try:
        from megatron.core.transformer.moe import fused_a2a
    except Exception:  # megatron-core that will not import here: nothing to release
        return None
    calls: list[Any] = []

    def nccl_ep_finalize() -> None:
        x = torch.ones(1, device=device)
        try:
            dist.all_reduce(x, group=group)
            _sync(device)
            calls.append(x.item())
        except Exception as error:
            calls.append(error_line(error))

    fused_a2a.nccl_ep_finalize = nccl_ep_finalize
    return calls


def _check_concert(number: int, cycle: dict[str, Any], made: list[str], released: Any) -> None:
    """What the destroy freed, in which order, and what it released first (its report)."""
    destroy = cycle["report"]["destroy"] or {}
    order = destroy.get("groups", {}).get("destroyed", [])
    cycle["free_order"], cycle["releases"] = order, destroy.get("releases", [])
    ours = [name for name in order if name in made]
    _check(
        f"cycle {number}: groups freed in creation order",
        ours == made,
        f"freed {order}; created {made}",
    )
    if released is None:
        _check(f"cycle {number}: Megatron's release ran first", None, "megatron not installed")
        return
    _check(
        f"cycle {number}: Megatron's release ran first",
        len(released) == number and isinstance(released[-1], float),
        f"spy calls {released} (each the group's all_reduce, before its free); report "
        f"{[(r['name'], r['ms']) for r in cycle['releases']]}",
    )


def _pool_setup(ctx: Ctx, torch: Any, group: Any, device: Any) -> tuple[list[Any], Any, list]:
    """A CUDA memory pool registered through the reloadable group (Megatron's nccl_allocator)."""
    registered: list[Any] = []
    pool = None
    if not ctx.rehearse and getattr(torch.cuda, "MemPool", None) is not None:
        backend = group._get_backend(device)
        if hasattr(backend, "register_mem_pool"):
            pool = torch.cuda.MemPool()
            with torch.cuda.use_mem_pool(pool):
                kept = torch.ones(1 << 20, device=device)  # a segment for the pool
            backend.register_mem_pool(pool)
            registered.append(kept)
    return registered, pool, []


def _pool_check(
    ctx: Ctx,
    *,
    torch: Any,
    dist: Any,
    group: Any,
    device: Any,
    registered: list[Any],
    pool: Any,
    hook_calls: list[int],
    native: bool,
) -> None:
    if not registered:
        why = (
            "the rehearsal has no CUDA memory pool"
            if ctx.rehearse
            else "this torch has no MemPool or register_mem_pool"
        )
        _check("a memory pool across reloads", None, f"skipped: {why}")
        return
    from reloadpg_autopatch.groups import pools

    record = getattr(group, "_record", None)
    entries = [h for h in record.replays if h[0] == pools.ENTRY] if record else []
    with torch.cuda.use_mem_pool(pool):
        x = torch.full((1 << 10,), 1.0, device=device)
    dist.all_reduce(x, group=group)
    _sync(device)
    want = 0 if native else 1
    _check(
        "a memory pool across reloads",
        len(entries) == want and len(hook_calls) == 2 and x[0].item() == float(ctx.world_size),
        f"kept registrations {len(entries)} (want {want}: the hook's re-registration is not "
        f"doubled); hook calls {hook_calls}; all_reduce on pool memory {x[0].item()}",
    )


def _rank_package_suspend(ctx: Ctx) -> None:
    """The package's suspend mode, activated by the gate at start-up."""
    import torch
    import torch.distributed as dist

    package = _activation()
    _check("activated by the gate alone", package["activated"], str(package.get("bootstrap")))
    import reloadpg_autopatch as rpg

    device = _device(ctx)
    stand_in = None
    if ctx.rehearse:
        stand_in = _stand_in()
        stand_in.set_device_total(16 * GiB)  # room for the resume and the guard's 3 GiB margin
        rpg.set_memory_probe(stand_in.memory_probe, device_types=("cpu", stand_in.ACCELERATOR))
        backend, kwargs = stand_in.NAME_A, {}
    else:
        backend, kwargs = ctx.backend or "nccl", {"device_id": device}
    dist.init_process_group(
        backend,
        init_method=ctx.init_method,
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=ctx.timeout(),
        **kwargs,
    )
    _data(mode=rpg.get_reload_mode(), backend=backend)
    _check_implementation(ctx, _implementation(ctx, dist.group.WORLD, device))
    rpg.register_default_process_group()
    control = dist.new_group(backend="gloo")  # left awake by the mode
    groups = [dist.new_group(list(range(ctx.world_size))) for _ in range(GROUPS)]
    world = dist.group.WORLD
    everyone = [world, *groups]
    _warm(everyone, ctx, device)
    graph = _capture(ctx, torch, dist, groups[0], device)
    cycles = []
    for number in range(1, ctx.cycles + 1):
        cycle: dict[str, Any] = {"free_before": _free_bytes(device, control, stand_in)}
        started = time.perf_counter()
        rpg.destroy_process_groups()
        cycle["destroy_ms"] = round((time.perf_counter() - started) * 1e3, 3)
        cycle["free_asleep"] = _free_bytes(device, control, stand_in)
        cycle["world_same_object"] = dist.group.WORLD is world
        try:
            dist.all_reduce(torch.ones(8, device=device), group=groups[1])
            cycle["collective_asleep"] = "no error: THE GUARD DID NOT FIRE"
        except Exception as error:
            cycle["collective_asleep"] = error_line(error)
        c = torch.ones(4)
        dist.all_reduce(c, group=control)
        cycle["gloo_asleep"] = c.tolist()
        try:  # its communicator would be split from WORLD's, which sleeps (nccl2: at creation)
            dist.new_group(list(range(ctx.world_size)))
            cycle["new_group_asleep"] = "no error: A GROUP WAS SPLIT FROM A SLEEPING WORLD"
        except Exception as error:
            cycle["new_group_asleep"] = error_line(error)
        started = time.perf_counter()
        rpg.reload_process_groups()
        cycle["reload_ms"] = round((time.perf_counter() - started) * 1e3, 3)
        cycle["free_resumed"] = _free_bytes(device, control, stand_in)
        cycle["correct_after_resume"] = _correct(everyone, ctx, device)
        cycle["report"] = rpg.last_cycle_report().to_dict()
        cycles.append(cycle)
        _data(cycles=cycles)
        _check(f"cycle {number}: WORLD is the same object", cycle["world_same_object"], "")
        _check(
            f"cycle {number}: a collective while asleep is refused",
            "GroupSuspendedError" in cycle["collective_asleep"],
            cycle["collective_asleep"],
        )
        _check(
            f"cycle {number}: a gloo group works while asleep",
            cycle["gloo_asleep"] == [float(ctx.world_size)] * 4,
            str(cycle["gloo_asleep"]),
        )
        _check(
            f"cycle {number}: a new group while WORLD sleeps is refused",
            "GroupSuspendedError" in cycle["new_group_asleep"]
            and "WORLD" in cycle["new_group_asleep"],
            cycle["new_group_asleep"],
        )
        _check(f"cycle {number}: right results after the reload", cycle["correct_after_resume"], "")
        nccl = cycle["report"].get("nccl") or {}
        released = nccl.get("nccl_released_bytes") or nccl.get("released_bytes")
        freed = cycle["free_asleep"] - cycle["free_before"]
        _check(
            f"cycle {number}: the device saw memory freed",
            freed > 0 if (released or 0) >= 2 * MiB else None,
            f"{freed / MiB:.1f} MiB (free memory), report: {json.dumps(nccl, default=str)[:300]}",
        )
    if graph is not None:
        t, replay = graph
        t.fill_(1.0)
        replay.replay()
        _sync(device)
        _check(
            "a CUDA graph captured before the cycles replays after them",
            bool(torch.all(t == ctx.world_size).item()),
            f"{t[:2].tolist()}",
        )
    first = cycles[0]
    _data(
        summary={
            "destroy_ms": first["destroy_ms"],
            "reload_ms": first["reload_ms"],
            "freed_by_suspend_bytes": first["free_asleep"] - first["free_before"],
            "report_nccl": first["report"].get("nccl"),
        }
    )
    dist.destroy_process_group()


def _capture(ctx: Ctx, torch: Any, dist: Any, group: Any, device: Any) -> Any:
    if ctx.rehearse:
        _check("a CUDA graph across the cycles", None, "skipped: the rehearsal has no CUDA")
        return None
    t = torch.ones(1024, device=device)
    stream = torch.cuda.Stream()
    try:
        dist.all_reduce(t, group=group)
        _sync(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            dist.all_reduce(t, group=group)
    except Exception as error:
        _check("a CUDA graph across the cycles", None, f"capture failed: {error_line(error)}")
        return None
    return t, graph


def _rank_refusal(ctx: Ctx) -> None:
    """In strict suspend mode, a setting that makes suspend refuse is refused up front."""
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    device = _device(ctx)
    if ctx.rehearse:
        stand_in = _stand_in()
        backend, kwargs = stand_in.NAME_A, {}
    else:
        backend, kwargs = "nccl", {"device_id": device}
    dist.init_process_group(
        backend,
        init_method=ctx.init_method,
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=ctx.timeout(),
        **kwargs,
    )
    try:
        rpg.register_default_process_group()
        refused = "no error"
    except Exception as error:
        refused = error_line(error)
    _data(refused=refused)
    names = [n for n in ("NCCL_CUMEM_ENABLE", "NCCL_COMM_SPLIT_SHARE_RESOURCES") if n in os.environ]
    _check(
        "refused up front, naming the setting",
        refused != "no error" and all(n in refused for n in names),
        refused,
    )
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


PROGRAMS: dict[str, Callable[[Ctx], None]] = {
    "preflight": _rank_preflight,
    "nccl_suspend": _rank_nccl_suspend,
    "raw_asleep": _rank_raw_asleep,
    "demo": _rank_demo,
    "checks": _rank_checks,
    "package_suspend": _rank_package_suspend,
    "refusal": _rank_refusal,
}


def rank_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="one rank of gpu_smoke.py")
    parser.add_argument("--rank-program", required=True, choices=sorted(PROGRAMS))
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--deadline", type=float, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--rehearse", action="store_true")
    parser.add_argument("--method", default=None)
    parser.add_argument("--backend", default=None)
    parser.add_argument("--cycles", type=int, default=2)
    args = parser.parse_args(argv)
    _orphan_guard(args.parent, args.deadline)
    ctx = Ctx(
        program=args.rank_program,
        rank=args.rank,
        world_size=args.world_size,
        port=args.port,
        deadline=args.deadline,
        rehearse=args.rehearse,
        method=args.method,
        backend=args.backend,
        cycles=args.cycles,
    )
    try:
        PROGRAMS[ctx.program](ctx)
    except Exception as error:
        _emit("error", message=f"{type(error).__name__}: {error}"[:2000])
        raise
    _emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(rank_main(sys.argv[1:]))
