"""The names, paths and limits the script and its ranks share, and two small helpers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SCHEMA = 1
SCRIPTS = Path(__file__).resolve().parent.parent  # scripts/, beside gpu_smoke.py
RANKS = SCRIPTS / "gpu_smoke_ranks.py"  # the program every rank runs
ROOT = SCRIPTS.parent
HOST = "127.0.0.1"
#: What the device machine allows one command is 10 minutes; the issue asks for 8.
BUDGET_S = 480.0
#: Per run, besides its deadline: the GPU check before it and reaping the ranks after it.
CHECK_S = 5.0
REAP_S = 3.0
#: The JSON takes in what the ranks of a running run said at most this often.
FLUSH_S = 0.5
#: A rank whose peer died is given this long to notice before it is killed too.
PEER_GRACE_S = 5.0
TAG = "@gpu_smoke "
DEMO_TAG = "@reloadpg_autopatch "  # what the package's demo rank emits (tools.launch.emit)
#: Testing only: every run's deadline times this (the JSON records it).
SCALE_ENV = "GPU_SMOKE_DEADLINE_SCALE"
GATE = "SLIME_RELOADABLE_PG"
MODE_ENV = "SLIME_RELOADABLE_PG_MODE"
SUSPEND_MIN = (2, 29, 7)  # ncclCommSuspend / ncclCommResume / ncclCommMemStats
MULTI_RANK_MIN = (2, 30, 0)  # NCCL_MULTI_RANK_GPU_ENABLE: two ranks on one GPU
SUSPEND_SYMBOLS = ("ncclCommSuspend", "ncclCommResume", "ncclCommMemStats")
NCCL_SUSPEND_MEM = 0x01
MEM_STATS = {"suspend": 0, "suspended": 1, "persist": 2, "total": 3}  # ncclCommMemStat_t
GROUPS = 4  # subgroups beside WORLD in the suspend measurements (Megatron makes about 20)
MiB = 2**20
GiB = 2**30
#: The implementations the suspend and in-place passes run on: plain ``nccl`` (nccl2 from torch
#: 2.15 on) and ``nccl-legacy`` (the classic ProcessGroupNCCL, by name, from torch 2.14 on).
IMPLEMENTATIONS = ("nccl", "nccl-legacy")
NCCL2_ENV = "TORCH_DIST_USE_NCCL2"


def error_line(error: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300] if text else ''}"


def dig(data: Any, *keys: str) -> Any:
    """``data[k1][k2]...``, or None where a level is missing (the preflight may be partial)."""
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data
