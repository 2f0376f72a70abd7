"""Bring WORLD into the destroy/reload cycle.

The default group holds an accelerator communicator like any other, but torch cannot run
without *a* default group: ``get_rank()``, object collectives and new groups all need one. So a
destroy swaps an accelerator WORLD for a temporary CPU WORLD, and a reload swaps it back. Both
are built on the store WORLD was created with, under keys no other generation uses, with the
timeout, bound device and options WORLD had, and under the name it had.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from . import aliases, faults, inplace, mode, names, rendezvous, state
from .backends import component_names, device_backends, holds_accelerator_memory, lazy_gloo
from .record import Record, State
from .reloadable import ReloadableProcessGroup

logger = logging.getLogger("reloadpg_autopatch")


@dataclass
class Registration:
    """What is needed to rebuild WORLD exactly as it was."""

    backend: str
    timeout: timedelta
    store: Any
    rank: int
    world_size: int
    device_id: Any
    pg_options: Any
    swap: bool
    temporary_backend: str
    #: WORLD is reconfigured in place on reload (native mode), never swapped.
    in_place: bool = False
    swapped: bool = False
    #: When WORLD is swapped: what WORLD's name resolves to, across every swap. Whatever
    #: resolved the name (a DeviceMesh dimension, FSDP2) holds this, not a WORLD that goes.
    stand_in: ReloadableProcessGroup | None = None


def group_timeout(group: Any) -> timedelta | None:
    """The timeout a native group runs with now (``set_timeout`` included), if torch says."""
    for _device, backend in device_backends(group):
        timeout = getattr(getattr(backend, "options", None), "_timeout", None)
        if isinstance(timeout, timedelta):
            return timeout
    return None


def _timeout_or_default(group: Any, backend: str) -> timedelta:
    """The group's timeout, or torch's default for its backend when torch does not say."""
    return group_timeout(group) or c10d._get_default_timeout(backend)


def _refresh_timeout(world: Registration) -> None:
    """Keep the timeout WORLD runs with now (``set_timeout`` included) for its next rebuild."""
    world.timeout = group_timeout(c10d._get_default_group()) or world.timeout


def _accelerator_options(group: Any, backend: str) -> Any:
    """The options object of WORLD's accelerator backend (NCCL's), to rebuild it with."""
    for device, native_backend in device_backends(group):
        if device.type == "cpu":
            continue
        options = getattr(native_backend, "options", None)
        if options is not None and holds_accelerator_memory(backend):
            return options
    return None


def register_default_process_group(
    timeout: timedelta | None = None,
    *,
    accelerator_backends: Iterable[str] | None = None,
    temporary_backend: str = "gloo",
) -> None:
    """Register WORLD so that ``destroy_process_groups()`` also frees its communicator.

    Call it right after ``init_process_group`` and before creating groups: from then on every
    new group is reloadable, because destroying WORLD tears down every group torch knows.
    WORLD is swapped for a temporary ``temporary_backend`` WORLD on destroy when its backend
    holds accelerator memory, as torch registers it (a backend that serves no CPU device:
    ``nccl``, ``xccl``, ``nccl2``...). ``accelerator_backends`` names the backends to swap
    instead (tests on CPU pass ``("gloo",)`` to exercise the swap). ``timeout`` is what WORLD is
    rebuilt with; by default, the timeout WORLD has now.
    """
    if timeout is not None and not isinstance(timeout, timedelta):
        raise TypeError(
            f"timeout must be a datetime.timedelta or None, got {type(timeout).__name__}"
        )
    chosen: tuple[str, ...] | None = None
    if accelerator_backends is not None:
        chosen = (
            (accelerator_backends,)
            if isinstance(accelerator_backends, str)
            else tuple(accelerator_backends)
        )
        if not all(isinstance(b, str) and b for b in chosen):
            raise TypeError(
                "accelerator_backends must be backend names such as 'nccl' (or None to use "
                f"the backends torch registers for accelerators only), got {chosen!r}"
            )
    if not isinstance(temporary_backend, str) or not temporary_backend:
        raise TypeError(f"temporary_backend must be a backend name, got {temporary_backend!r}")
    if not dist.is_initialized():
        raise RuntimeError(
            "register_default_process_group() needs WORLD: call "
            "torch.distributed.init_process_group() first"
        )
    backend = str(c10d.get_backend())
    default_group = c10d._get_default_group()
    in_place = mode.reloads_in_place(default_group)
    if in_place:
        swap = False
        mode.copy_as_handle()
    elif chosen is None:
        swap = holds_accelerator_memory(backend)
    else:
        swap = bool(set(component_names(backend)) & {b.lower() for b in chosen})
    holder = state.current()
    holder.world = Registration(
        backend=backend,
        timeout=timeout if timeout is not None else _timeout_or_default(default_group, backend),
        store=c10d._get_default_store(),
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        device_id=default_group.bound_device_id,
        pg_options=_accelerator_options(default_group, backend),
        swap=swap,
        temporary_backend=temporary_backend,
        in_place=in_place,
    )
    holder.known_world = default_group
    if swap:
        record = Record((), {}, str(default_group.group_name), State.LIVE)
        record.is_world = True
        stand_in = ReloadableProcessGroup(
            default_group, list(range(holder.world.world_size)), _record=record
        )
        holder.world.stand_in = stand_in
        names.publish(record.name, stand_in)
        _make_default(stand_in)
    logger.info(
        "registered WORLD for reload: backend=%s rank=%d world_size=%d %s timeout=%s",
        backend,
        holder.world.rank,
        holder.world.world_size,
        "in place" if in_place else f"swap={swap}",
        holder.world.timeout,
    )


def registration() -> Registration | None:
    """This process's registration, if WORLD is registered."""
    return state.current().world


def is_registered() -> bool:
    """Whether WORLD takes part in destroy/reload in this process."""
    return state.current().world is not None


def needs_swap() -> bool:
    """Whether the next destroy replaces WORLD (registered, accelerator, not swapped yet)."""
    world = registration()
    return world is not None and world.swap and not world.swapped


def base_store() -> Any:
    """The store every rank shares for the life of this world (it outlives WORLD itself)."""
    world = registration()
    return world.store if world is not None else c10d._get_default_store()


def world_timeout() -> timedelta:
    world = registration()
    if world is not None:
        return world.timeout
    return _timeout_or_default(c10d._get_default_group(), str(c10d.get_backend()))


def global_rank() -> int:
    world = registration()
    return world.rank if world is not None else dist.get_rank()


def world_size() -> int:
    world = registration()
    return world.world_size if world is not None else dist.get_world_size()


def sync(step: str) -> None:
    """Wait until every rank reaches ``step`` of this generation, through the base store.

    The store outlives every communicator, so it can sync ranks while WORLD is replaced, and
    ranks may arrive up to WORLD's timeout apart. Three store operations per rank
    (``rendezvous.sync``): a missing rank is named in the error, after WORLD's timeout.
    """
    key = state.current().key("sync", step)
    rendezvous.sync(
        base_store(),
        key,
        global_rank(),
        world_size(),
        timeout=world_timeout(),
        step=f"{step}: sync",
    )


def _init_world(world: Registration, backend: str, destroy_all: Callable[[], None]) -> None:
    holder = state.current()
    with names.preserved_group_count():
        destroy_all()
        store = dist.PrefixStore(holder.key("world", backend) + "/", world.store)
        kwargs: dict[str, Any] = {}
        if backend == world.backend:
            if world.device_id is not None:
                kwargs["device_id"] = world.device_id
            if world.pg_options is not None:
                kwargs["pg_options"] = world.pg_options
        # The temporary WORLD connects its pairs on first use: a swap costs O(1) per rank.
        temporary = backend == world.temporary_backend and not world.swapped
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
            step = (
                f"destroy_process_groups(): creating the temporary {backend} WORLD"
                if temporary
                else f"reload_process_groups(): restoring the {backend} WORLD"
            )
            raise faults.failure(
                step,
                f"world {holder.epoch}, cycle {holder.generation}",
                store=world.store,
                key=holder.key("world", backend),
                ranks=range(world.world_size),
                rank=world.rank,
                timeout=world.timeout,
                started=started,
                error=error,
            ) from error
    default = c10d._get_default_group()
    holder.known_world = default
    stand_in = world.stand_in
    if stand_in is not None:  # torch cleared its maps and names: point them at us again
        stand_in.group = default
        stand_in.mirror_backends()
        stand_in._record.alias = aliases.link(stand_in, default)
        names.publish(str(default.group_name), stand_in)
        _make_default(stand_in)


def _make_default(stand_in: ReloadableProcessGroup) -> None:
    """Make WORLD's stand-in torch's default group: one WORLD object for the life of the world.

    ``dist.group.WORLD``, ``GroupMember.WORLD`` and ``_get_default_group()`` all read
    ``_world.default_pg``. Code keeps that object (Megatron's checkpoint strategies, a
    ``P2POp``, Dynamo's guards on compiled code that uses WORLD), so it must be the same one
    before and after every swap; the native WORLD behind it changes, and torch's maps answer
    for the stand-in through its aliases.
    """
    c10d._world.default_pg = stand_in
    state.current().known_world = stand_in


def native_world() -> Any:
    """The native group serving as WORLD now (behind the stand-in when WORLD is swapped)."""
    default = c10d._world.default_pg
    return default.group if isinstance(default, ReloadableProcessGroup) else default


def forget() -> None:
    """The program destroyed WORLD: the registration ends, and so does WORLD's stand-in."""
    holder = state.current()
    world = holder.world
    holder.world = None
    if world is not None and world.stand_in is not None:
        if c10d._world.default_pg is world.stand_in:  # torch's destroy clears it; this is not
            c10d._world.default_pg = None
        world.stand_in.group = None
        world.stand_in._record.ended_with_world = True
        world.stand_in._record.move(State.ENDED)


def swap_out(destroy_all: Callable[[], None]) -> None:
    """Replace the accelerator WORLD with the temporary one (callers check ``needs_swap``)."""
    world = registration()
    assert world is not None
    _refresh_timeout(world)
    _init_world(world, world.temporary_backend, destroy_all)
    world.swapped = True
    logger.info(
        "replaced %s WORLD with a temporary %s WORLD", world.backend, world.temporary_backend
    )


def swap_in(destroy_all: Callable[[], None]) -> bool:
    """Restore the original WORLD if it was swapped out. Returns whether it did."""
    world = registration()
    if world is None or not world.swapped:
        return False
    _init_world(world, world.backend, destroy_all)
    world.swapped = False
    logger.info("restored %s WORLD", world.backend)
    return True


def release_in_place() -> None:
    """Free WORLD's communicator in place (native mode); the object stays the default group."""
    world = registration()
    if world is not None and world.in_place:
        _refresh_timeout(world)
        inplace.release(c10d._get_default_group())


def rebuild_in_place() -> None:
    """Reconfigure WORLD in place, before the groups (native mode)."""
    world = registration()
    if world is not None and world.in_place:
        inplace.rebuild(c10d._get_default_group(), "WORLD", world.timeout)
