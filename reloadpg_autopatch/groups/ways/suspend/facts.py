"""What the suspend way knows about itself, for the doctor: whether this torch can suspend
and guard a sleeping group, the NCCL it was built with and runs, what stays resident, what the
environment keeps a suspend from freeing, and what ``auto`` mode frees instead."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .... import _env
from .capability import environment_refusal, min_freed_share, torch_can_suspend, torch_has_pre_hooks

#: What no suspend frees, whatever the environment.
RESIDENT_ALWAYS = "inter-node network buffers and NVLS buffers stay resident"


def _nccl_versions() -> dict[str, str | None]:
    versions = {}
    for getter in ("get_build_nccl_version", "get_runtime_nccl_version"):
        call = getattr(getattr(dist, "ProcessGroupNCCL", None), getter, None)
        try:
            versions[getter] = ".".join(map(str, call())) if call else None
        except Exception:  # no NCCL in this build, or no driver to ask
            versions[getter] = None
    return versions


def auto_frees() -> str:
    """What ``auto`` mode frees instead of suspending (``ways.candidates_for``, the share)."""
    share = min_freed_share()
    return (
        "one-rank groups are freed and made again, never suspended (a suspend keeps their "
        f"network buffer); a group whose suspend would free less than {share:.0%} of its "
        f"memory ({_env.SUSPEND_MIN_FREED_ENV}) is freed instead; the last cycle report names "
        "them (freed, not suspended)"
    )


def facts(warnings: list[str], auto: bool) -> dict[str, Any]:
    """This torch's suspend, its guard while asleep, NCCL's versions, and the warnings: the
    environment's first, then ``warnings`` (what the doctor knows of the NCCL in use); with
    ``auto``, what ``auto`` mode frees instead."""
    versions = _nccl_versions()
    return {
        "torch": torch.__version__,
        "available": torch_can_suspend(),
        "guard": "pre-hook" if torch_has_pre_hooks() else "wrapper",
        "nccl_build": versions["get_build_nccl_version"],
        "nccl_runtime": versions["get_runtime_nccl_version"],
        "warnings": [w for w in (environment_refusal(),) if w] + warnings,
        "resident_always": RESIDENT_ALWAYS,
        "auto": auto_frees() if auto else None,
    }
