"""WORLD's registration: WORLD joins the destroy/reload cycle as the first record.

``register_default_process_group`` checks every argument before anything changes, chooses
WORLD's way (``ways.choose``: suspended, in place, swapped for a temporary WORLD, or left
awake) and records WORLD first, so that destroy and reload treat it as they treat any group.
What is needed to rebuild WORLD exactly as it was, and what the program asked for (a second
registration must ask the same), is kept in the ``Registration``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ...errors import RegistrationError, ReloadPGError
from .. import backends, names, process, registry, torch_class
from ..backends import component_names, device_backends, holds_accelerator_memory
from ..record import State
from ..ways.wrapper import ReloadableProcessGroup
from . import carry, settings_round, swap, ways
from .end import check_world

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
    temporary_backend: str
    #: WORLD's record (None: WORLD stays awake, as it is).
    record: Any = None
    #: Swapped for the temporary WORLD now (between a destroy and its reload).
    swapped: bool = False
    #: When WORLD is swapped, or suspended behind a wrapper: what WORLD's name resolves to,
    #: across every swap. Whatever resolved the name (a DeviceMesh dimension, FSDP2) holds
    #: this, not a WORLD that goes.
    stand_in: Any = None
    #: What the program asked for (``timeout`` given or None, ``accelerator_backends``
    #: normalised, ``temporary_backend``): a second registration must ask the same.
    asked: tuple[Any, ...] = ()

    @property
    def swap(self) -> bool:
        return self.record is not None and self.record.way is ways.SWAP


def _accelerator_options(group: Any, backend: str) -> Any:
    """The options object of WORLD's accelerator backend (NCCL's), to rebuild it with."""
    for device, native_backend in device_backends(group):
        if device.type == "cpu":
            continue
        options = getattr(native_backend, "options", None)
        if options is not None and holds_accelerator_memory(backend):
            return options
    return None


# ---- the arguments ---------------------------------------------------------------------------


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
    if holder.world.registration is not None:
        _same_registration(holder.world.registration, timeout, chosen, temporary)
        return
    # Before WORLD's way is chosen (which may refuse): every rank's settings, compared.
    settings_round.agree_once("register_default_process_group()")
    backend = str(c10d.get_backend())
    default_group = c10d._get_default_group()
    named = chosen is not None and bool(set(component_names(backend)) & set(chosen))
    way = ways.choose(default_group, backend, named, chosen)
    if way is ways.SWAP:
        # Said here, refused at the first destroy: that is the first round every rank meets
        # in, and such a group may exist on some ranks only (a refusal here would leave the
        # others waiting in their next creation).
        for line in carry.obstacles(carry.left_alone()):
            logger.warning(
                "register_default_process_group(): WORLD is swapped on destroy, but %s; the "
                "first destroy_process_groups() will refuse on every rank",
                line,
            )
    if way is not None and way.torch_object:
        torch_class.handed()
    world = Registration(
        backend=backend,
        timeout=timeout
        if timeout is not None
        else backends.timeout_or_default(default_group, backend),
        store=c10d._get_default_store(),
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        device_id=default_group.bound_device_id,
        pg_options=_accelerator_options(default_group, backend),
        temporary_backend=temporary,
        asked=(chosen, temporary),
    )
    # Nothing above changed anything: only now does the registration take effect.
    holder.world.registration = holder.world.facts = world
    registry.belong_to(default_group, again=True)
    if way is not None:
        # WORLD is the first record. (A swapped WORLD's record holds no native group: holding
        # the first one would keep its communicator, and its sockets, for ever.)
        record = registry.add((), {}, str(default_group.group_name), State.LIVE, way, first=True)
        world.record = record
        if way is not ways.SWAP:  # it sleeps and wakes inside torch's default group
            record.native = default_group
        if not way.torch_object:  # swapped, or suspended behind a wrapper (torch 2.13)
            world.stand_in = ReloadableProcessGroup(
                default_group, list(range(world.world_size)), _record=record
            )
            names.publish(record.name, world.stand_in)
            swap.make_default(world.stand_in)
    logger.info(
        "registered WORLD for reload: backend=%s rank=%d world_size=%d %s timeout=%s",
        backend,
        world.rank,
        world.world_size,
        way.name if way is not None else "awake",
        world.timeout,
    )


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
