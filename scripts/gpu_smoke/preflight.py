"""Step 1, ``preflight``: what torch, CUDA, NCCL and the package are here.

One fresh rank started with the gate alone records torch, CUDA, the driver, NCCL as built and
as loaded (``ncclGetVersion`` of the libnccl in the process, and a call of its suspend API on a
null communicator), which implementation a plain ``nccl`` group gets, whether nccl2 can be
registered, and whether the package's ``.pth`` activated it. Every later step plans from it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import sys
from typing import Any

from .common import GATE, MODE_ENV, error_line
from .nccl import c_api_probe, nccl_library
from .plan import Facts, Run, Step
from .rank import Ctx, activation, check, data, load_stand_in, rank_device, sync


def _plan_preflight(_facts: Facts) -> tuple[list[Run], str | None]:
    return [Run("preflight", "preflight", 1, 40.0, {GATE: "1"})], None


STEP = Step("preflight", "what torch, CUDA, NCCL and the package are here", _plan_preflight)


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
    data(
        python=sys.version.split()[0],
        executable=sys.executable,
        platform=platform.platform(),
        rank_started_with={GATE: os.environ.get(GATE), MODE_ENV: os.environ.get(MODE_ENV)},
    )
    try:
        import torch
        import torch.distributed as dist
    except Exception as error:
        data(torch=None, torch_error=error_line(error))
        check("torch imports", False, error_line(error))
        return
    package = activation()
    data(package=package)
    check(
        "the package activated by the gate alone",
        package["activated"],
        f"started by site: {package.get('started_by_site')}, patched: {package.get('patched')}",
    )
    c10d = torch._C._distributed_c10d
    nccl_class = getattr(c10d, "ProcessGroupNCCL", None)
    data(
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
    data(nccl=nccl, implementation=nccl_implementation(dist))
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
    data(cuda=cuda)
    found = importlib.util.find_spec("megatron") is not None
    megatron = {"installed": found, "version": None}
    if found:
        from importlib.metadata import PackageNotFoundError, version

        with contextlib.suppress(PackageNotFoundError):
            megatron["version"] = version("megatron-core")
    data(megatron=megatron)
    if ctx.rehearse:
        stand_in = load_stand_in()
        data(
            stand_in={
                "path": stand_in.__file__,
                "claims_nccl": stand_in.NCCL_VERSION,
                "python_backend": stand_in.python_backend_available(),
            }
        )
    # Last, as it may hang: a one-rank group of each kind, and the class torch made for it.
    if ctx.rehearse or (cuda["available"] and dist.is_nccl_available()):
        data(made=_made_groups(ctx, torch, dist))


def _made_groups(ctx: Ctx, torch: Any, dist: Any) -> dict[str, Any]:
    device = rank_device(ctx)
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
            sync(device)
            made[name] = {"class": type(impl).__name__, "all_reduce": t.item()}
        except Exception as error:
            made[name] = {"error": error_line(error)}
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    return made


PROGRAMS = {"preflight": _rank_preflight}
