"""WORLD's swap: an accelerator WORLD replaced by a temporary CPU WORLD, and restored.

The default group holds an accelerator communicator like any other, but torch cannot run
without *a* default group: ``get_rank()``, object collectives and new groups all need one. So a
destroy swaps an accelerator WORLD for a temporary CPU WORLD, and a reload swaps it back. Both
are built on the store WORLD was created with, under keys no other cycle uses, with the
timeout, bound device and options WORLD had, and under the name it had. Whatever torch's
``init_process_group`` changes in the process at each swap (it chains ``sys.excepthook``) is put
back, so a week of cycles leaves the process as the first WORLD left it. WORLD's stand-in (a
``ReloadableProcessGroup``) stays torch's default group for the life of the world.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ...errors import ReloadPGError, WorldLostError
from .. import aliases, backends, faults, frees, names, process, registry
from ..stepping import lose_world
from ..store import channel, written
from ..ways.wrapper import ReloadableProcessGroup
from . import carry
from .end import end_world

logger = logging.getLogger("reloadpg_autopatch")

#: gloo's switch for connecting pairs on first use instead of a full mesh at creation (read
#: when the group's device is created, on torch 2.13 and 2.14 alike).
LAZY_GLOO = "TORCH_GLOO_LAZY_INIT"


def refresh_timeout(world: Any) -> None:
    """Keep the timeout WORLD runs with now (``set_timeout`` included) for its next rebuild."""
    world.timeout = backends.group_timeout(c10d._get_default_group()) or world.timeout


@contextlib.contextmanager
def lazy_gloo(enabled: bool = True) -> Iterator[None]:
    """gloo groups created in the block connect a pair only when it first communicates.

    The temporary WORLD of a swap is rarely used: created eagerly, it costs every rank a
    connection to every other rank (N² in all) each cycle, for nothing. The variable is put
    back exactly as it was, set or unset (the first block to enter saves it, the last to leave
    restores it).
    """
    if not enabled:
        yield
        return
    holder = process.current()
    held = holder.world
    with holder.lock:
        if held.lazy_depth == 0:
            held.lazy_saved = os.environ.get(LAZY_GLOO)
        held.lazy_depth += 1
        os.environ[LAZY_GLOO] = "1"
    try:
        yield
    finally:
        with holder.lock:
            held.lazy_depth -= 1
            if held.lazy_depth == 0:
                if held.lazy_saved is None:
                    os.environ.pop(LAZY_GLOO, None)
                else:
                    os.environ[LAZY_GLOO] = held.lazy_saved


@contextlib.contextmanager
def process_globals_kept() -> Iterator[None]:
    """Whatever torch's WORLD calls change in the process is as it was after the block.

    ``init_process_group`` wraps ``sys.excepthook`` in a new ``[rank N]:`` prefixer each time:
    two swaps per cycle would nest two more wrappers every cycle (seven prefixes per line after
    three cycles, a ``RecursionError`` in the hook after a few hundred). The hooks and the
    variables it sets are put back; the first WORLD's hook, made by the program's own
    ``init_process_group``, stays.
    """
    hooks = (sys.excepthook, threading.excepthook, sys.unraisablehook)
    environ = dict(os.environ)
    try:
        yield
    finally:
        sys.excepthook, threading.excepthook, sys.unraisablehook = hooks
        for key in set(os.environ) - set(environ):
            if key != LAZY_GLOO:  # lazy_gloo puts its own variable back
                del os.environ[key]
        for key, value in environ.items():
            if key != LAZY_GLOO and os.environ.get(key) != value:
                os.environ[key] = value


def _init_world(world: Any, backend: str, step: str) -> None:
    """Destroy the WORLD there is, start ``backend``'s; a failure leaves none, and says so.

    torch's destroy of WORLD ends every group it knows: the groups this package did not make
    reloadable are kept out of its reach and put back as they were (``carry``)."""
    holder = process.current()
    temporary = backend == world.temporary_backend and not world.swapped
    with names.preserved_group_count(), process_globals_kept(), carry.carried():
        try:
            frees.destroy_every_group("WORLD", world.world_size)
        except ReloadPGError as error:
            if not frees.stuck(error):
                raise
            raise _lost(error, temporary) from None  # torch tore every group down
        key = holder.key(step, "world", channel.token(), backend)
        store = written.recording("world", key + "/")  # each rank deletes what it writes
        kwargs: dict[str, Any] = {}
        if backend == world.backend:
            if world.device_id is not None:
                kwargs["device_id"] = world.device_id
            if world.pg_options is not None:
                kwargs["pg_options"] = world.pg_options
        # The temporary WORLD connects its pairs on first use: a swap costs O(1) per rank.
        started = time.monotonic()
        try:
            with lazy_gloo(temporary):
                dist.init_process_group(
                    backend=backend,
                    store=store,
                    rank=world.rank,
                    world_size=world.world_size,
                    timeout=world.timeout,
                    **kwargs,
                )
        except Exception as error:
            what = (
                f"destroy_process_groups(): creating the temporary {backend} WORLD"
                if temporary
                else f"reload_process_groups(): restoring the {backend} WORLD"
            )
            failure = faults.failure(
                what,
                channel.where(step),
                store=world.store,
                key=key,
                ranks=range(world.world_size),
                rank=world.rank,
                timeout=world.timeout,
                started=started,
                error=error,
            )
            raise _lost(failure, temporary) from error
    default = c10d._get_default_group()
    registry.belong_to(default, again=True)
    stand_in = world.stand_in
    if stand_in is not None:  # torch cleared its maps and names: point them at us again
        stand_in.group = default
        stand_in.mirror_backends()
        stand_in._record.alias = aliases.link(stand_in, default)
        names.publish(str(default.group_name), stand_in)
        make_default(stand_in)


def _lost(failure: ReloadPGError, temporary: bool) -> WorldLostError:
    """WORLD is gone and no other took its place: end this world, and say how to go on.

    torch has no default group any more, so nothing of this world can be reloaded: its records
    end here (not half-way later), and the error says so. It is raised from ``failure`` (a
    ``PeerMissingError`` when a peer never came), whose ranks it repeats in ``missing``.
    """
    end_world()
    state = (
        "the accelerator WORLD was destroyed and the temporary WORLD could not be created"
        if temporary
        else "the temporary WORLD was destroyed and the accelerator WORLD could not be restored"
    )
    text = (
        f"{failure}. State: WORLD is gone on this rank ({state}), so every group of this "
        "world ended and torch.distributed is not initialized. To go on, every rank calls "
        "torch.distributed.init_process_group() again (then register_default_process_group()"
        " and creates its groups); or the job restarts"
    )
    lose_world(text)
    return WorldLostError(text, getattr(failure, "missing", ()))


def make_default(stand_in: ReloadableProcessGroup) -> None:
    """Make WORLD's stand-in torch's default group: one WORLD object for the life of the world.

    ``dist.group.WORLD``, ``GroupMember.WORLD`` and ``_get_default_group()`` all read
    ``_world.default_pg``. Code keeps that object (Megatron's checkpoint strategies, a
    ``P2POp``, Dynamo's guards on compiled code that uses WORLD), so it must be the same one
    before and after every swap; the native WORLD behind it changes, and torch's maps answer
    for the stand-in through its aliases.
    """
    c10d._world.default_pg = stand_in
    registry.belong_to(stand_in, again=True)


def swap_out() -> None:
    """Replace the accelerator WORLD with the temporary one (callers check ``facts.needs_swap``)."""
    world = channel.registration()
    assert world is not None
    refresh_timeout(world)
    _init_world(world, world.temporary_backend, "destroy")
    world.swapped = True
    logger.info(
        "replaced %s WORLD with a temporary %s WORLD", world.backend, world.temporary_backend
    )


def swap_in() -> bool:
    """Restore the original WORLD if it was swapped out. Returns whether it did."""
    world = channel.registration()
    if world is None or not world.swapped:
        return False
    _init_world(world, world.backend, "reload")
    world.swapped = False
    logger.info("restored %s WORLD", world.backend)
    return True
