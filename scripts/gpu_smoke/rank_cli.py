"""The command line every rank runs (``scripts/gpu_smoke_ranks.py``), in a fresh interpreter.

The script starts it with ``--rank-program NAME`` and the run's arguments, each rank in a
process session of its own; a rank ends itself if the script dies.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import sys
import threading
import time

from .rank import Ctx, emit
from .steps import PROGRAMS


def orphan_guard(parent: int, deadline: float) -> None:
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


def rank_main(argv: list[str]) -> int:
    """Read a rank's arguments, guard against orphaning, run its program; report how it ended."""
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
    orphan_guard(args.parent, args.deadline)
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
        emit("error", message=f"{type(error).__name__}: {error}"[:2000])
        raise
    emit("done")
    return 0
