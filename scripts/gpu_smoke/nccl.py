"""NCCL as torch loaded it: its library, its version, its suspend API through torch or through
ctypes (nccl.h, 2.29.7 and later), and WORLD on NCCL (or on the stand-in) for the raw steps."""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

from .common import MEM_STATS, NCCL_SUSPEND_MEM, SUSPEND_SYMBOLS, error_line
from .rank import Ctx, load_stand_in, rank_device


def decode_nccl_version(code: int) -> tuple[int, int, int]:
    """``ncclGetVersion``'s integer as (major, minor, patch); nccl.h's NCCL_VERSION, inverted."""
    if code >= 10000:  # 2.9 and later: X * 10000 + Y * 100 + Z
        return code // 10000, code % 10000 // 100, code % 100
    return code // 1000, code % 1000 // 100, code % 100


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


def communicators(ctx: Ctx, groups: list[Any], device: Any) -> list[Any]:
    """Each group's communicator, driven as ``--method`` says: torch's API or NCCL's C API."""
    if ctx.method == "ctypes":
        found = nccl_library()
        library = NcclLibrary(
            found["path"] if found["path"] != "(symbols of the process)" else None
        )
        return [CComm(library, int(g._get_backend(device)._comm_ptr())) for g in groups]
    return [TorchComm(g._get_backend(device)) for g in groups]


def raw_world(ctx: Ctx) -> tuple[Any, Any, Any, Any]:
    """WORLD on NCCL with eager init (a GPU) or on the stand-in (the rehearsal)."""
    import torch
    import torch.distributed as dist

    device = rank_device(ctx)
    stand_in = None
    if ctx.rehearse:
        stand_in = load_stand_in()
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
