"""Who takes part in a step, through which store, with what timeout.

Every store step of a cycle involves every rank of WORLD, through the store WORLD was created
with (it outlives every communicator, WORLD's own included), and waits at most WORLD's timeout.
With WORLD registered (``register_default_process_group``) those come from the registration,
which keeps them across WORLD's swap; otherwise from torch's default group. Both the WORLD swap
(``world``) and the in-place rebuild (``inplace``) sit above this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from . import process, rendezvous
from .backends import device_backends


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
    #: WORLD's communicator is suspended in place (suspend mode): no swap, and ``record``
    #: stands for WORLD in destroy and reload (behind ``stand_in`` on torch 2.13).
    suspend: bool = False
    record: Any = None
    swapped: bool = False
    #: When WORLD is swapped: what WORLD's name resolves to, across every swap. Whatever
    #: resolved the name (a DeviceMesh dimension, FSDP2) holds this, not a WORLD that goes.
    stand_in: Any = None
    #: What the program asked for (``timeout`` given or None, ``accelerator_backends``
    #: normalised, ``temporary_backend``): a second registration must ask the same.
    asked: tuple[Any, ...] = ()


def group_timeout(group: Any) -> timedelta | None:
    """The timeout a native group runs with now (``set_timeout`` included), if torch says."""
    for _device, backend in device_backends(group):
        timeout = getattr(getattr(backend, "options", None), "_timeout", None)
        if isinstance(timeout, timedelta):
            return timeout
    return None


def timeout_or_default(group: Any, backend: str) -> timedelta:
    """The group's timeout, or torch's default for its backend when torch does not say."""
    return group_timeout(group) or c10d._get_default_timeout(backend)


def registration() -> Registration | None:
    """This process's registration, if WORLD is registered."""
    return process.current().world


def is_registered() -> bool:
    """Whether WORLD takes part in destroy/reload in this process."""
    return process.current().world is not None


def base_store() -> Any:
    """The store every rank shares for the life of this world (it outlives WORLD itself)."""
    world = registration()
    return world.store if world is not None else c10d._get_default_store()


def world_timeout() -> timedelta:
    world = registration()
    if world is not None:
        return world.timeout
    return timeout_or_default(c10d._get_default_group(), str(c10d.get_backend()))


def global_rank() -> int:
    world = registration()
    return world.rank if world is not None else dist.get_rank()


def world_size() -> int:
    world = registration()
    return world.world_size if world is not None else dist.get_world_size()


def where(step: str) -> str:
    """How errors name ``step`` of the cycle running now."""
    return f"cycle {process.current().cycle}, {step}"


def sync(step: str, point: str, *, token: bool = False) -> None:
    """Wait until every rank reaches ``point`` of ``step`` in this cycle, through the store.

    Ranks may arrive up to WORLD's timeout apart; three store operations per rank
    (``rendezvous.sync``). A missing rank is named in the error, after WORLD's timeout.
    ``token``: every rank also reads the step's fresh token (``ProcessState.token``).
    """
    holder = process.current()
    key = holder.key(step, "sync", point)
    fresh = rendezvous.sync(
        base_store(),
        key,
        global_rank(),
        world_size(),
        timeout=world_timeout(),
        step=f"{step}: {point} sync",
        cycle=where(step),
        previous=_round_done(holder, key),
        token=token,
    )
    if fresh is not None:
        holder.token = fresh


def agree(step: str, point: str, payload: bytes, merge: Any) -> bytes:
    """Every rank's ``payload`` merged by the last to arrive; every rank reads the one result.

    It also gives every rank the step's fresh token (``ProcessState.token``).
    """
    holder = process.current()
    key = holder.key(step, point)
    holder.token, merged = rendezvous.agree(
        base_store(),
        key,
        global_rank(),
        world_size(),
        payload,
        merge=merge,
        timeout=world_timeout(),
        step=f"{step}: {point}",
        cycle=where(step),
        previous=_round_done(holder, key),
        token=True,
    )
    return merged


def _round_done(holder: process.ProcessState, key: str) -> str | None:
    """The previous world-wide round's result key (deleted by this round's last arriver).

    Every rank has read it once it arrives at the next round, and every rank runs the same
    rounds in the same order, so the last arriver of a round may delete its predecessor's:
    the store holds at most one result key of ours at a time, whatever the number of cycles.
    """
    last = holder.last_round
    holder.last_round = (base_store(), rendezvous.done_key(key))
    return last[1] if last is not None else None


def tidy() -> None:
    """The world ends: delete the last round's result, so a store used again starts clean."""
    holder = process.current()
    last, holder.last_round = holder.last_round, None
    if last is not None:
        rendezvous.tidy(*last)
