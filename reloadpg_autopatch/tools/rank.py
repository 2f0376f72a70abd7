"""The rank side of ``launch``: what a rank the launcher started says back, and how it joins.

A rank talks to the launcher through tagged JSON lines on stdout (``emit``), says "up" before
it joins WORLD (``init_rank``), and, when it fails, ends at once with exit code 1 (``fail``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from datetime import timedelta
from typing import Any, NoReturn

EVENT_TAG = "@reloadpg_autopatch "
HOST = "127.0.0.1"


def emit(event: dict[str, Any]) -> None:
    """Report an event to the launcher (one tagged JSON line on stdout)."""
    sys.stdout.write(EVENT_TAG + json.dumps(event) + "\n")
    sys.stdout.flush()


def rank_parser(description: str) -> argparse.ArgumentParser:
    """An argument parser that already knows the options the launcher passes to each rank."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--host", default=HOST)
    parser.add_argument("--port", type=int, required=True)
    parser.set_defaults(launched=True)  # init_rank then tells the launcher this rank came up
    return parser


def init_rank(args: argparse.Namespace, backend: str = "gloo", timeout: float = 30.0) -> None:
    """Join the launcher's store and initialise WORLD on ``backend``.

    A rank started by ``launch`` first reports that it came up, so that the launcher can tell a
    rank that never started from ranks left waiting for it.
    """
    if getattr(args, "launched", False):
        emit({"type": "up", "rank": args.rank})
    import torch.distributed as dist

    store = dist.TCPStore(
        args.host,
        args.port,
        args.world_size,
        is_master=getattr(args, "store_host", False),  # tests may make a rank host it
        timeout=timedelta(seconds=timeout),
    )
    dist.init_process_group(
        backend,
        store=store,
        rank=args.rank,
        world_size=args.world_size,
        timeout=timedelta(seconds=timeout),
    )


def fail(error: BaseException) -> NoReturn:
    """Report ``error`` to the launcher, print its traceback and end this rank at once with exit
    code 1. An interpreter's exit tears down the half-used gloo groups it still holds, which can
    abort it ("terminate called without an active exception"): the launcher would then blame
    SIGABRT, not the failure."""
    emit({"type": "error", "message": f"{type(error).__name__}: {error}"})
    traceback.print_exception(error)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
