"""Destroy and reload every reloadable group of this process (and WORLD when registered).

Both steps are collective in the SPMD sense: every rank calls them at the same point, as it
calls ``new_group``. Both are idempotent: a second destroy or reload in a row does nothing.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch.distributed as dist

from .._originals import destroy_native, original
from . import registry, world
from .reloadable import ReloadableProcessGroup
from .unwrap import unwrap

__all__ = [
    "adopt",
    "destroy_process_groups",
    "end_world",
    "release",
    "reload_process_groups",
    "reloadable_groups",
    "unwrap",
]

logger = logging.getLogger("reloadpg_autopatch")


def _destroy_world() -> None:
    original("destroy_process_group")()


def destroy_process_groups() -> None:
    """Free the communicators of every reloadable group; the group objects stay valid.

    With WORLD registered (``register_default_process_group``) and on an accelerator backend,
    WORLD is replaced by a temporary gloo WORLD after the ranks have synchronised.
    """
    started = time.perf_counter()
    with registry.lock():
        swapping = world.needs_swap()
        if swapping:
            world.sync("destroy")
        count = registry.current().destroy(destroy_native)
        if swapping:
            world.swap_out(_destroy_world)
    logger.info(
        "destroyed %d process groups%s in %.1f ms",
        count,
        " and swapped WORLD" if swapping else "",
        (time.perf_counter() - started) * 1e3,
    )


def reload_process_groups() -> None:
    """Recreate every destroyed group in creation order (WORLD first, when it was swapped)."""
    if not dist.is_initialized():
        raise RuntimeError(
            "reload_process_groups() needs torch.distributed to be initialized: call "
            "torch.distributed.init_process_group() first (WORLD was never initialized, or "
            "the program destroyed it)"
        )
    started = time.perf_counter()
    with registry.lock():
        swapped = world.swap_in(_destroy_world)
        if swapped:
            # Restoring WORLD tore down every group torch knew, including any created on the
            # temporary WORLD since the destroy: all of them are rebuilt below.
            registry.current().forget_natives()
        count = registry.current().reload(original("new_group"), destroy_native)
    logger.info(
        "reloaded %d process groups%s in %.1f ms",
        count,
        " and WORLD" if swapped else "",
        (time.perf_counter() - started) * 1e3,
    )


def reloadable_groups() -> list[ReloadableProcessGroup]:
    """The reloadable groups of this process that the program still holds."""
    return registry.current().live_groups()


def adopt(native: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Record a group creation and wrap the result when this rank is a member."""
    if native is not None and not isinstance(native, int) and type(native) is not dist.ProcessGroup:
        logger.debug("leaving %s native: new_group returned a custom class", type(native).__name__)
        return native
    record = registry.current().add(args, kwargs)
    record.native = native
    if type(native) is dist.ProcessGroup:
        return ReloadableProcessGroup(native, None, _record=record)
    return native  # NON_GROUP_MEMBER (or None with use_local_synchronization)


def release(group: Any) -> bool:
    """Destroy one of our groups for good (through the wrapper or its native handle).

    Returns False when ``group`` is not one of ours, so the caller hands it to torch.
    """
    if isinstance(group, ReloadableProcessGroup):
        registry.current().release(group._record, destroy_native)
        return True
    native = unwrap(group)
    if native is None or native is dist.GroupMember.WORLD:
        return False
    record = registry.current().record_of(native)
    if record is None:
        return False
    registry.current().release(record, destroy_native)
    return True


def end_world() -> None:
    """The program destroyed WORLD: torch tore down every group, and the registration ends."""
    registry.current().forget_natives()
    world.forget()
