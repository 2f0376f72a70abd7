"""The memory guard: free memory checked before a reloaded group's first collective.

NCCL allocates a communicator's buffers when the group first communicates, which after a reload
is the first collective on each group. slime checks free memory before every collective and,
below a threshold, collects garbage and empties the allocator's cache so that NCCL finds room;
that costs a device query per call. Here a reload *arms* each rebuilt group, and only the first
collective on an armed group pays the check (``ReloadableProcessGroup``'s fast slot is empty
while armed, so the check sits on the slow path that the wrappers take anyway for such a group).
"""

from __future__ import annotations

import gc
import logging
import os
from typing import Any

import torch

from .. import _env
from . import memory, process, settings
from .record import State
from .settings import MemoryGuard

logger = logging.getLogger("reloadpg_autopatch")

__all__ = ["MemoryGuard", "arm", "armed_device", "check", "get_memory_guard", "set_memory_guard"]

DEFAULT_MIN_FREE_GB = _env.DEFAULT_MIN_FREE_GB  # slime's threshold


def set_memory_guard(min_free_gb: float = DEFAULT_MIN_FREE_GB, *, every_call: bool = False) -> None:
    """Check free accelerator memory before a reloaded group's first collective.

    Below ``min_free_gb`` GiB free, the guard collects garbage and empties the allocator's
    cache; ``0`` turns it off. ``every_call=True`` checks before every collective on an
    accelerator group, as slime does (a device query per call).
    """
    value = _check_gb(min_free_gb)
    if not isinstance(every_call, bool):
        raise TypeError(f"every_call must be True or False, got {every_call!r}")
    held = settings.current()
    with held.lock:
        held.guard = MemoryGuard(value, every_call)
    if every_call and value > 0:
        _arm_live_groups()


def _arm_live_groups() -> None:
    """Every call is checked from now on: arm the live reloadable groups (WORLD's stand-in
    among them: WORLD is the first record)."""
    for record in process.current().records.all:
        if record.state is State.LIVE:
            arm(record.wrapper)


def arm(wrapper: Any) -> None:
    """Have the guard check before ``wrapper``'s next call, if its group holds memory it can
    ask about (None, a destroyed group, or the guard off: nothing)."""
    native = getattr(wrapper, "group", None)
    device = armed_device(native) if native is not None else None
    if device is not None:
        wrapper.arm(device)


def _check_gb(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"min_free_gb must be a number of GiB (0 turns the guard off), got {value!r}"
        )
    largest = _env.LARGEST_MIN_FREE_GB
    if not 0 <= value <= largest:  # also NaN and infinity: every check converts it to bytes
        raise ValueError(
            f"min_free_gb must be 0 (off) or a finite number of GiB up to {largest:.0f}, got "
            f"{value!r}"
        )
    return float(value)


def get_memory_guard() -> MemoryGuard:
    """The guard's settings now (from the environment until ``set_memory_guard``)."""
    held = settings.current()
    guard = held.guard
    if guard is None:
        guard = _from_environment()
        with held.lock:
            if held.guard is None:
                held.guard = guard
            guard = held.guard
    return guard


def _from_environment() -> MemoryGuard:
    """``SLIME_RELOADABLE_PG_MIN_FREE_GB`` and ``..._MEMORY_GUARD_EVERY_CALL``; a bad value is
    reported once per process."""
    min_free = DEFAULT_MIN_FREE_GB
    raw = os.environ.get(_env.MIN_FREE_ENV)
    problem = _env.min_free_problem(raw)
    if problem is None and raw is not None and raw.strip():
        min_free = _env.parse_min_free_gb(raw)
    elif problem is not None and _env.first_report(_env.MIN_FREE_ENV, raw or ""):
        logger.warning("%s", problem)
    raw = os.environ.get(_env.EVERY_CALL_ENV)
    every = raw is not None and raw.strip().lower() in _env.ON_VALUES
    problem = _env.every_call_problem(raw)
    if problem is not None and _env.first_report(_env.EVERY_CALL_ENV, raw or ""):
        logger.warning("%s", problem)
    return MemoryGuard(min_free, every)


def armed_device(native: Any) -> torch.device | None:
    """The device to check before ``native``'s first collective after a reload, if any."""
    if get_memory_guard().min_free_gb <= 0:
        return None
    return memory.device_of(native)


def check(device: torch.device, label: str) -> None:
    """The guard: below the threshold, collect garbage and empty the device's cache."""
    guard = get_memory_guard()
    if guard.min_free_gb <= 0:
        return
    now = memory.figures(device)
    if now is None or now.free >= guard.min_free_gb * memory.GiB:
        return
    logger.info(
        "%.2f GiB free on %s before the first collective on %s (below %.2f GiB): collecting "
        "garbage and emptying the cache",
        now.free / memory.GiB,
        device,
        label,
        guard.min_free_gb,
    )
    gc.collect()
    try:
        memory.clear(device)
    except Exception as error:
        logger.warning("emptying the cache of %s failed: %s", device, error)
