"""``wrapper_checks``' CUDA memory pool, registered through a reloadable group as Megatron's
``nccl_allocator`` does, and registered again by a reload hook after each reload."""

from __future__ import annotations

from typing import Any

from .rank import Ctx, check, sync


def pool_setup(ctx: Ctx, torch: Any, group: Any, device: Any) -> tuple[list[Any], Any, list]:
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


def pool_check(
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
    """The pool's memory in a collective after the reloads, and its registration kept once."""
    if not registered:
        why = (
            "the rehearsal has no CUDA memory pool"
            if ctx.rehearse
            else "this torch has no MemPool or register_mem_pool"
        )
        check("a memory pool across reloads", None, f"skipped: {why}")
        return
    from reloadpg_autopatch.groups import pools

    record = getattr(group, "_record", None)
    entries = [h for h in record.replays if h[0] == pools.ENTRY] if record else []
    with torch.cuda.use_mem_pool(pool):
        x = torch.full((1 << 10,), 1.0, device=device)
    dist.all_reduce(x, group=group)
    sync(device)
    want = 0 if native else 1
    check(
        "a memory pool across reloads",
        len(entries) == want and len(hook_calls) == 2 and x[0].item() == float(ctx.world_size),
        f"kept registrations {len(entries)} (want {want}: the hook's re-registration is not "
        f"doubled); hook calls {hook_calls}; all_reduce on pool memory {x[0].item()}",
    )
