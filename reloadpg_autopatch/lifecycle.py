"""Destroy and reload every reloadable group of this process (and WORLD when registered).

Both steps are collective in the SPMD sense: every rank calls them at the same point, as it
calls ``new_group``. Both are idempotent: a second destroy or reload in a row does nothing.
"""

from __future__ import annotations

import logging
import time

import torch.distributed as dist

from . import patch, registry, world
from .group import ReloadableProcessGroup

logger = logging.getLogger("reloadpg_autopatch")


def _destroy_world() -> None:
    patch.original("destroy_process_group")()


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
        count = registry.current().destroy(patch.destroy_native)
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
        count = registry.current().reload(patch.original("new_group"), patch.destroy_native)
    logger.info(
        "reloaded %d process groups%s in %.1f ms",
        count,
        " and WORLD" if swapped else "",
        (time.perf_counter() - started) * 1e3,
    )


def reloadable_groups() -> list[ReloadableProcessGroup]:
    """The reloadable groups of this process that the program still holds."""
    return registry.current().live_groups()
