"""Bring WORLD into the destroy/reload cycle, and end a world when the program destroys WORLD.

The default group holds an accelerator communicator like any other, but torch cannot run
without *a* default group: ``get_rank()``, object collectives and new groups all need one. So a
destroy swaps an accelerator WORLD for a temporary CPU WORLD, and a reload swaps it back. Both
are built on the store WORLD was created with, under keys no other cycle uses, with the
timeout, bound device and options WORLD had, and under the name it had. Whatever torch's
``init_process_group`` changes in the process at each swap (it chains ``sys.excepthook``) is put
back, so a week of cycles leaves the process as the first WORLD left it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from .._originals import original
from ..errors import ModeRefusedError, RegistrationError, ReloadPGError, WorldLostError
from . import (
    aliases,
    binding,
    faults,
    inplace,
    mode,
    names,
    participants,
    process,
    registry,
    suspended,
)
from .backends import component_names, device_backends, holds_accelerator_memory
from .participants import Registration, registration
from .record import Record, State, Way
from .reloadable import ReloadableProcessGroup

logger = logging.getLogger("reloadpg_autopatch")

#: gloo's switch for connecting pairs on first use instead of a full mesh at creation (read
#: when the group's device is created, on torch 2.13 and 2.14 alike).
LAZY_GLOO = "TORCH_GLOO_LAZY_INIT"


def _refresh_timeout(world: Registration) -> None:
    """Keep the timeout WORLD runs with now (``set_timeout`` included) for its next rebuild."""
    world.timeout = participants.group_timeout(c10d._get_default_group()) or world.timeout


def _accelerator_options(group: Any, backend: str) -> Any:
    """The options object of WORLD's accelerator backend (NCCL's), to rebuild it with."""
    for device, native_backend in device_backends(group):
        if device.type == "cpu":
            continue
        options = getattr(native_backend, "options", None)
        if options is not None and holds_accelerator_memory(backend):
            return options
    return None


# ---- registration ----------------------------------------------------------------------------


def _checked_timeout(timeout: object) -> timedelta | None:
    if timeout is None:
        return None
    if not isinstance(timeout, timedelta):
        raise TypeError(
            f"timeout must be a datetime.timedelta or None, got {type(timeout).__name__}"
        )
    if timeout <= timedelta(0):
        raise ValueError(
            f"timeout must be a positive datetime.timedelta (WORLD's timeout bounds every "
            f"store wait of a cycle), got {timeout!r}; accepted: None (WORLD's own timeout) "
            "or, for instance, timedelta(minutes=10)"
        )
    return timeout


def _known_backends() -> dict[str, list[str]]:
    capability = dist.Backend.backend_capability
    return {name.lower(): list(devices) for name, devices in capability.items()}


def _available(name: str) -> bool:
    check = getattr(dist, f"is_{name}_available", None)
    return bool(check()) if callable(check) else True


def _checked_temporary(name: object) -> str:
    """A backend torch knows and has built that runs WORLD on the CPU (``gloo``, ``cpu:gloo``)."""
    known = _known_backends()
    serving_cpu = sorted(n for n, devices in known.items() if "cpu" in devices and _available(n))
    why = None
    if not isinstance(name, str) or not name.strip():
        why = "is not a backend name"
    else:
        parts = [part.strip().lower() for part in name.split(",")]
        for part in parts:
            backend = part.rsplit(":", 1)[-1]
            if backend not in known:
                why = f"names {backend!r}, which is not a backend torch knows"
            elif not _available(backend):
                why = f"names {backend!r}, which this torch build does not have"
            if why:
                break
        else:
            cpu = [p.rsplit(":", 1)[-1] for p in parts if ":" not in p or p.split(":")[0] == "cpu"]
            if not any("cpu" in known[b] for b in cpu):
                why = "serves no CPU device"
    if why is not None:
        raise ValueError(
            f"temporary_backend={name!r} {why}: the temporary WORLD runs on the CPU while the "
            f"accelerator WORLD sleeps; accepted here: {', '.join(map(repr, serving_cpu))} (or "
            "a device map such as 'cpu:gloo')"
        )
    return name.strip()


def _checked_accelerators(backends: Iterable[str] | str | None) -> tuple[str, ...] | None:
    if backends is None:
        return None
    chosen = (backends,) if isinstance(backends, str) else tuple(backends)
    known = _known_backends()
    if not all(isinstance(b, str) and b for b in chosen):
        raise TypeError(
            "accelerator_backends must be backend names such as 'nccl' (or None to use "
            f"the backends torch registers for accelerators only), got {chosen!r}"
        )
    unknown = [b for b in chosen if b.lower() not in known]
    if unknown:
        raise ValueError(
            f"accelerator_backends names backends torch does not know: {unknown!r}; "
            f"accepted: {', '.join(map(repr, sorted(known)))}"
        )
    return tuple(sorted({b.lower() for b in chosen}))


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
    rebuilt with; by default, the timeout WORLD has now. Every argument is checked here, before
    anything changes; a second call for the same WORLD with the same arguments does nothing,
    and with other arguments raises ``RegistrationError`` and keeps the first registration.
    """
    timeout = _checked_timeout(timeout)
    chosen = _checked_accelerators(accelerator_backends)
    temporary = _checked_temporary(temporary_backend)
    if not dist.is_initialized():
        raise ReloadPGError(
            "register_default_process_group() needs WORLD: call "
            "torch.distributed.init_process_group() first"
        )
    holder = process.current()
    check_world(holder)
    if holder.world is not None:
        _same_registration(holder.world, timeout, chosen, temporary)
        return
    backend = str(c10d.get_backend())
    default_group = c10d._get_default_group()
    named = chosen is not None and bool(set(component_names(backend)) & set(chosen))
    suspend = _suspends(default_group, backend, named)
    in_place = not suspend and mode.reloads_in_place(default_group)
    if suspend or in_place:
        swap = False
        mode.copy_as_handle()
    elif chosen is None:
        swap = holds_accelerator_memory(backend)
    else:
        swap = named
    world = Registration(
        backend=backend,
        timeout=timeout
        if timeout is not None
        else participants.timeout_or_default(default_group, backend),
        store=c10d._get_default_store(),
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        device_id=default_group.bound_device_id,
        pg_options=_accelerator_options(default_group, backend),
        swap=swap,
        temporary_backend=temporary,
        in_place=in_place,
        suspend=suspend,
        asked=(chosen, temporary),
    )
    if swap or suspend:
        record = Record((), {}, str(default_group.group_name), State.LIVE)
        record.is_world = True
        if suspend:
            # It sleeps and wakes in place. (A swapped WORLD's record holds no native group:
            # holding the first one would keep its communicator, and its sockets, for ever.)
            record.native = default_group
            record.way = Way.SUSPEND if suspended.torch_has_pre_hooks() else Way.SUSPEND_WRAPPED
            world.record = record
        if swap or record.way is Way.SUSPEND_WRAPPED:  # a wrapper guards WORLD on torch 2.13
            world.stand_in = ReloadableProcessGroup(
                default_group, list(range(world.world_size)), _record=record
            )
    # Nothing above changed anything: only now does the registration take effect.
    holder.world = world
    holder.known_world = default_group
    if world.stand_in is not None:
        names.publish(world.stand_in._record.name, world.stand_in)
        _make_default(world.stand_in)
    logger.info(
        "registered WORLD for reload: backend=%s rank=%d world_size=%d %s timeout=%s",
        backend,
        world.rank,
        world.world_size,
        "suspend in place" if suspend else "in place" if in_place else f"swap={swap}",
        world.timeout,
    )


def _suspends(default_group: Any, backend: str, named: bool) -> bool:
    """Whether WORLD sleeps by suspend (suspend and auto modes, where its backend can).

    In ``suspend`` mode a WORLD that cannot is refused, unless it is on a CPU backend only and
    not named in ``accelerator_backends``: then it stays awake, as gloo groups do.
    """
    chosen = mode.get_reload_mode()
    if chosen not in ("suspend", "auto"):
        return False
    found = suspended.capability(default_group)
    refusal = mode.suspend_refusal(default_group, found)
    if refusal is None:
        return True
    if chosen == "suspend" and not (found.cpu_only and not named):
        raise ModeRefusedError(
            f"SLIME_RELOADABLE_PG_MODE=suspend (or set_reload_mode('suspend')) but WORLD "
            f"({backend}) cannot be suspended in place: {refusal}; use mode 'auto' to swap it "
            "for a temporary WORLD instead"
        )
    return False


def destroys_every_group() -> bool:
    """Whether a destroy takes WORLD down, and with it every group torch knows: then every
    group must be reloadable (slime's rule). A WORLD that suspends, or stays awake, does not."""
    world = registration()
    return world is not None and not world.suspend


def _same_registration(
    world: Registration,
    timeout: timedelta | None,
    chosen: tuple[str, ...] | None,
    temporary: str,
) -> None:
    """A second registration of this WORLD: nothing if it asks the same, else the error."""
    differences = []
    if timeout is not None and timeout != world.timeout:
        differences.append(f"timeout={timeout!r} (registered: {world.timeout!r})")
    if chosen != world.asked[0]:
        differences.append(f"accelerator_backends={chosen!r} (registered: {world.asked[0]!r})")
    if temporary != world.temporary_backend:
        differences.append(
            f"temporary_backend={temporary!r} (registered: {world.temporary_backend!r})"
        )
    if not differences:
        logger.debug("register_default_process_group() again with the same arguments: kept")
        return
    raise RegistrationError(
        "register_default_process_group() was already called for this WORLD, and this call "
        f"asks for {'; '.join(differences)}: the first registration stays in force. Register "
        "WORLD once, right after init_process_group(); to change it, destroy WORLD "
        "(torch.distributed.destroy_process_group()) and start a new one"
    )


def needs_swap() -> bool:
    """Whether the next destroy replaces WORLD (registered, accelerator, not swapped yet)."""
    world = registration()
    return world is not None and world.swap and not world.swapped


# ---- the swap --------------------------------------------------------------------------------


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
    with holder.lock:
        if holder.lazy_depth == 0:
            holder.lazy_saved = os.environ.get(LAZY_GLOO)
        holder.lazy_depth += 1
        os.environ[LAZY_GLOO] = "1"
    try:
        yield
    finally:
        with holder.lock:
            holder.lazy_depth -= 1
            if holder.lazy_depth == 0:
                if holder.lazy_saved is None:
                    os.environ.pop(LAZY_GLOO, None)
                else:
                    os.environ[LAZY_GLOO] = holder.lazy_saved


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


def _init_world(world: Registration, backend: str, step: str) -> None:
    """Destroy the WORLD there is, start ``backend``'s; a failure leaves none, and says so."""
    holder = process.current()
    with names.preserved_group_count(), process_globals_kept():
        original("destroy_process_group")()
        key = holder.key(step, "world", holder.token, backend)
        store = dist.PrefixStore(key + "/", world.store)
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
            what = (
                f"destroy_process_groups(): creating the temporary {backend} WORLD"
                if temporary
                else f"reload_process_groups(): restoring the {backend} WORLD"
            )
            failure = faults.failure(
                what,
                participants.where(step),
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
    holder.known_world = default
    stand_in = world.stand_in
    if stand_in is not None:  # torch cleared its maps and names: point them at us again
        stand_in.group = default
        stand_in.mirror_backends()
        stand_in._record.alias = aliases.link(stand_in, default)
        names.publish(str(default.group_name), stand_in)
        _make_default(stand_in)


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
    process.current().lost = text
    return WorldLostError(text, getattr(failure, "missing", ()))


def _make_default(stand_in: ReloadableProcessGroup) -> None:
    """Make WORLD's stand-in torch's default group: one WORLD object for the life of the world.

    ``dist.group.WORLD``, ``GroupMember.WORLD`` and ``_get_default_group()`` all read
    ``_world.default_pg``. Code keeps that object (Megatron's checkpoint strategies, a
    ``P2POp``, Dynamo's guards on compiled code that uses WORLD), so it must be the same one
    before and after every swap; the native WORLD behind it changes, and torch's maps answer
    for the stand-in through its aliases.
    """
    c10d._world.default_pg = stand_in
    process.current().known_world = stand_in


def native_world() -> Any:
    """The native group serving as WORLD now (behind the stand-in when WORLD is swapped or
    suspended behind it)."""
    default = c10d._world.default_pg
    if isinstance(default, ReloadableProcessGroup):
        return default.group if default.group is not None else default._record.native
    return default


def swap_out() -> None:
    """Replace the accelerator WORLD with the temporary one (callers check ``needs_swap``)."""
    world = registration()
    assert world is not None
    _refresh_timeout(world)
    _init_world(world, world.temporary_backend, "destroy")
    world.swapped = True
    logger.info(
        "replaced %s WORLD with a temporary %s WORLD", world.backend, world.temporary_backend
    )


def swap_in() -> bool:
    """Restore the original WORLD if it was swapped out. Returns whether it did."""
    world = registration()
    if world is None or not world.swapped:
        return False
    _init_world(world, world.backend, "reload")
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


# ---- the end of a world ----------------------------------------------------------------------


def threaded_world() -> bool:
    """Whether ranks are threads of this process (torch's threaded process groups).

    torch's ``MultiThreadedTestCase`` replaces ``_world`` with one world per thread. This
    package's state is per process, so there groups stay torch's own and destroy and reload
    have nothing to do: the gate changes nothing, as with the gate off.
    """
    return type(c10d._world) is not c10d._World


def check_world(holder: process.ProcessState) -> None:
    """End the records of a WORLD the program replaced without telling us."""
    known = holder.known_world
    if known is not None and c10d._world.default_pg is not known:
        logger.info("WORLD was destroyed and replaced behind our back: its groups end")
        end_world()


def _forget(holder: process.ProcessState) -> None:
    """The registration ends, and so does WORLD's stand-in."""
    world = holder.world
    holder.world = None
    if world is not None and world.stand_in is not None:
        if c10d._world.default_pg is world.stand_in:  # torch's destroy clears it; this is not
            c10d._world.default_pg = None
        world.stand_in.group = None
        world.stand_in._record.ended_with_world = True
        world.stand_in._record.move(State.ENDED)


def end_world() -> None:
    """WORLD is gone: torch tore down every group, and this world's records end for good."""
    if threaded_world():
        return  # nothing of ours belongs to a thread's world
    holder = process.current()
    with holder.lock:
        for record in holder.records:
            binding.unserve(record, destroy=False)  # torch destroyed every group, and its maps
            record.ended_with_world = True
            if record.state is not State.ENDED:
                record.move(State.ENDED)
        registry.prune()
        participants.tidy()
        _forget(holder)
        holder.begin_world()
