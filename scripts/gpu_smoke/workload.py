"""What the suspend steps do on their groups: fill every communicator's buffers, check results,
read the device's free memory when every rank got there, time a call."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .common import MiB
from .rank import Ctx, sync


def free_bytes(device: Any, control: Any, stand_in: Any) -> int:
    """Free device memory when every rank got here (mem_get_info is device-wide)."""
    import torch
    import torch.distributed as dist

    sync(device)
    if control is not None:
        dist.barrier(group=control)
    if stand_in is not None:
        return int(stand_in.device_memory()[0])
    return int(torch.cuda.mem_get_info(device)[0])


def warm(groups: list[Any], ctx: Ctx, device: Any) -> None:
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
    sync(device)


def correct(groups: list[Any], ctx: Ctx, device: Any) -> bool:
    """Whether an all_reduce and a broadcast on every group give the right results."""
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
    sync(device)
    return ok


def time_ms(call: Callable[[], Any]) -> float:
    """Milliseconds ``call`` took."""
    started = time.perf_counter()
    call()
    return round((time.perf_counter() - started) * 1e3, 3)
