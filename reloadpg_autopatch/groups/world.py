"""Bring WORLD into the destroy/reload cycle.

The default group holds an accelerator communicator like any other, but torch cannot run
without *a* default group: ``get_rank()``, object collectives and new groups all need one. So a
destroy swaps the accelerator WORLD for a temporary gloo WORLD, and a reload swaps it back. Both
are built on the store WORLD was created with, each under a fresh ``PrefixStore`` namespace per
generation, so no key of an earlier generation can be mistaken for a new one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from . import policy

logger = logging.getLogger("reloadpg_autopatch")

#: Backends whose WORLD holds accelerator memory and is swapped out on destroy.
DEFAULT_ACCELERATOR_BACKENDS = ("nccl", "xccl", "hccl", "mccl", "cncl")

_NAMESPACE = "reloadpg_autopatch/world"


@dataclass
class WorldState:
    """What is needed to rebuild WORLD exactly as it was."""

    backend: str
    timeout: timedelta | None
    store: Any
    rank: int
    world_size: int
    device_id: Any
    swap: bool
    temporary_backend: str
    generation: int = 0
    swapped: bool = False


_STATES: dict[int, WorldState] = {}


def state() -> WorldState | None:
    """This process's registration, if WORLD is registered."""
    return _STATES.get(os.getpid())


def is_registered() -> bool:
    """Whether WORLD takes part in destroy/reload in this process."""
    return os.getpid() in _STATES


def register_default_process_group(
    timeout: timedelta | None = None,
    *,
    accelerator_backends: Iterable[str] = DEFAULT_ACCELERATOR_BACKENDS,
    temporary_backend: str = "gloo",
) -> None:
    """Register WORLD so that ``destroy_process_groups()`` also frees its communicator.

    Call it right after ``init_process_group`` and before creating groups: from then on every
    new group is reloadable, because destroying WORLD tears down every group torch knows.
    ``accelerator_backends`` names the backends whose WORLD is swapped for a temporary
    ``temporary_backend`` WORLD on destroy (tests on CPU pass ``("gloo",)`` to exercise the
    swap); a WORLD on any other backend is left alone. ``timeout`` is what WORLD is rebuilt
    with and how long the ranks wait for each other (None: torch's default for the backend).
    """
    if timeout is not None and not isinstance(timeout, timedelta):
        raise TypeError(
            f"timeout must be a datetime.timedelta or None, got {type(timeout).__name__}"
        )
    backends = (
        (accelerator_backends,)
        if isinstance(accelerator_backends, str)
        else tuple(accelerator_backends)
    )
    if not all(isinstance(b, str) and b for b in backends):
        raise TypeError(f"accelerator_backends must be backend names, got {backends!r}")
    names = tuple(b.lower() for b in backends)
    if not isinstance(temporary_backend, str) or not temporary_backend:
        raise TypeError(f"temporary_backend must be a backend name, got {temporary_backend!r}")
    if not dist.is_initialized():
        raise RuntimeError(
            "register_default_process_group() needs WORLD: call "
            "torch.distributed.init_process_group() first"
        )
    backend = str(c10d.get_backend())
    default_group = c10d._get_default_group()
    registration = WorldState(
        backend=backend,
        timeout=timeout,
        store=c10d._get_default_store(),
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        device_id=default_group.bound_device_id,
        swap=bool(set(policy.backend_names(backend)) & set(names)),
        temporary_backend=temporary_backend,
    )
    _STATES[os.getpid()] = registration
    logger.info(
        "registered WORLD for reload: backend=%s rank=%d world_size=%d swap=%s",
        backend,
        registration.rank,
        registration.world_size,
        registration.swap,
    )


def forget() -> None:
    """Drop the registration (the program destroyed WORLD itself)."""
    _STATES.pop(os.getpid(), None)


def needs_swap() -> bool:
    """Whether the next destroy replaces WORLD (registered, accelerator, not swapped yet)."""
    registration = state()
    return registration is not None and registration.swap and not registration.swapped


def sync(step: str) -> None:
    """Wait until every rank reaches ``step``, through the store WORLD was created with.

    The store outlives every communicator, so it can sync ranks while WORLD is being replaced.
    """
    registration = state()
    if registration is None:
        return
    key = f"{_NAMESPACE}/{registration.generation}/{step}"
    if registration.store.add(key, 1) == registration.world_size:
        registration.store.set(f"{key}/done", b"1")
    registration.store.wait([f"{key}/done"], registration.timeout or registration.store.timeout)


def _init_world(registration: WorldState, backend: str, destroy_all: Callable[[], None]) -> None:
    registration.generation += 1
    destroy_all()
    store = dist.PrefixStore(
        f"{_NAMESPACE}/{registration.generation}/{backend}/", registration.store
    )
    kwargs: dict[str, Any] = {}
    if backend == registration.backend and registration.device_id is not None:
        kwargs["device_id"] = registration.device_id
    dist.init_process_group(
        backend=backend,
        store=store,
        rank=registration.rank,
        world_size=registration.world_size,
        timeout=registration.timeout,
        **kwargs,
    )


def swap_out(destroy_all: Callable[[], None]) -> None:
    """Replace the accelerator WORLD with the temporary one (callers check ``needs_swap``)."""
    registration = state()
    assert registration is not None
    _init_world(registration, registration.temporary_backend, destroy_all)
    registration.swapped = True
    logger.info(
        "replaced %s WORLD with a temporary %s WORLD (generation %d)",
        registration.backend,
        registration.temporary_backend,
        registration.generation,
    )


def swap_in(destroy_all: Callable[[], None]) -> bool:
    """Restore the original WORLD if it was swapped out. Returns whether it did."""
    registration = state()
    if registration is None or not registration.swapped:
        return False
    sync("reload")
    _init_world(registration, registration.backend, destroy_all)
    registration.swapped = False
    logger.info("restored %s WORLD (generation %d)", registration.backend, registration.generation)
    return True
