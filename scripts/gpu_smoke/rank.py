"""What every rank program uses: its arguments, its reports to the script, its device.

A rank reports to the script through tagged JSON lines on stdout (``data`` merged into its
record as it arrives, so a rank killed midway keeps what it said; ``check`` verdicts;
``error``). Nothing here imports torch before a program starts.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

from .common import HOST, TAG, error_line


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


def emit(kind: str, **fields: Any) -> None:
    """One tagged JSON line on stdout: how a rank speaks to the script."""
    sys.stdout.write(TAG + json.dumps({"type": kind, **fields}, default=str) + "\n")
    sys.stdout.flush()


def data(**fields: Any) -> None:
    """Data for the parent, merged into this rank's record as it arrives (a kill keeps it)."""
    emit("data", **fields)


def check(name: str, ok: bool | None, detail: str) -> bool:
    """A check's verdict; ``ok=None`` records it as skipped (``detail`` says why)."""
    status = "skipped" if ok is None else ("ok" if ok else "failed")
    emit("check", name=name, status=status, detail=detail)
    return bool(ok)


def load_stand_in() -> Any:
    """The package's CPU model of NCCL's suspend (``reloadpg_autopatch.tools.cpu_nccl``, NCCL's
    protocol on gloo); importing it registers its backends."""
    return importlib.import_module("reloadpg_autopatch.tools.cpu_nccl")


def rank_device(ctx: Ctx) -> Any:
    """The device this rank runs on (CPU in the rehearsal); on a GPU its free memory is recorded."""
    import torch

    if ctx.rehearse:
        return torch.device("cpu")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    free, total = torch.cuda.mem_get_info(device)
    data(memory_at_start={"free": free, "total": total})
    return device


def sync(device: Any) -> None:
    """Wait for the device's work (CUDA only): a timing or a reading after it sees it done."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def activation() -> dict[str, Any]:
    """Whether the ``.pth`` activated the package in this process (before torch is touched)."""
    try:
        import reloadpg_autopatch as rpg
        import reloadpg_autopatch._startup as bootstrap
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


def implementation_of(ctx: Ctx, group: Any, device: Any) -> dict[str, Any]:
    """Which implementation served ``group`` on ``device`` (the package's reading of what the
    backend answers), what was asked for, and the variable that chose what ``nccl`` means."""
    from reloadpg_autopatch.tools.doctor import implementations

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
    data(implementation=found)
    return found


def check_implementation(ctx: Ctx, found: dict[str, Any]) -> None:
    """On a GPU, ``nccl-legacy`` is the classic backend and the ``nccl`` pass is nccl2 (the
    plan sets the variable where ``nccl`` is not nccl2 by default)."""
    want = {"nccl-legacy": "classic", "nccl": "nccl2"}.get(str(ctx.backend))
    if ctx.rehearse or want is None:
        check("the implementation asked for", None, f"rehearsal: {found}")
        return
    check("the implementation asked for", found.get("implementation") == want, str(found))
