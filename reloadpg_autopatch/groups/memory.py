"""Accelerator memory: the query, the guard before a reloaded group's first collective, notes.

NCCL allocates a communicator's buffers when the group first communicates, which after a reload
is the first collective on each group. slime checks free memory before every collective and,
below a threshold, collects garbage and empties the allocator's cache so that NCCL finds room;
that costs a device query per call. Here a reload *arms* each rebuilt group, and only the first
collective on an armed group pays the check (``ReloadableProcessGroup``'s fast slot is empty
while armed, so the check sits on the slow path that the wrappers take anyway for such a group).

The query is replaceable (``set_memory_probe``): CPU has no accelerator memory to ask about,
so tests supply a probe, and so can a framework with its own accounting.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch

from .. import _env
from .backends import holds_accelerator_memory

logger = logging.getLogger("reloadpg_autopatch")

GiB = float(2**30)


class MemoryFigures(NamedTuple):
    """Accelerator memory of one device, in bytes."""

    free: int
    total: int
    allocated: int
    reserved: int

    def describe(self) -> str:
        return (
            f"free {self.free / GiB:.2f} GiB of {self.total / GiB:.2f} GiB, allocated "
            f"{self.allocated / GiB:.2f} GiB, reserved {self.reserved / GiB:.2f} GiB"
        )

    def to_dict(self) -> dict[str, int]:
        return dict(self._asdict())


class MemoryGuard(NamedTuple):
    """The guard's settings: the free memory it wants, and whether it checks every call."""

    min_free_gb: float
    every_call: bool


Probe = Callable[["torch.device"], "MemoryFigures | None"]

DEFAULT_MIN_FREE_GB = 3.0  # slime's threshold

_lock = threading.Lock()
_guard: MemoryGuard | None = None  # None: not read from the environment yet
_probe: Probe | None = None
_probe_types: frozenset[str] | None = None  # None: every type but the CPU
_clear: Callable[[torch.device], None] | None = None


def _device_module(device_type: str) -> Any:
    return getattr(torch, device_type, None)


def default_probe(device: torch.device) -> MemoryFigures | None:
    """torch's own figures for an accelerator device (CUDA, XPU...); None where it has none."""
    module = _device_module(device.type)
    mem_get_info = getattr(module, "mem_get_info", None)
    if mem_get_info is None or not module.is_available():
        return None
    free, total = mem_get_info(device)
    allocated = getattr(module, "memory_allocated", lambda _d: 0)(device)
    reserved = getattr(module, "memory_reserved", lambda _d: 0)(device)
    return MemoryFigures(int(free), int(total), int(allocated), int(reserved))


def default_clear(device: torch.device) -> None:
    """Wait for the device's work, then hand the allocator's cached blocks back to it."""
    if device.type == "cpu":
        return
    module = _device_module(device.type)
    if hasattr(module, "synchronize"):
        module.synchronize(device)
    if hasattr(module, "empty_cache"):
        module.empty_cache()


def set_memory_probe(
    probe: Probe | None,
    *,
    device_types: Iterable[str] | None = None,
    clear: Callable[[torch.device], None] | None = None,
) -> None:
    """Replace the accelerator memory query (``None``: torch's own, the default).

    ``probe(device)`` returns ``MemoryFigures`` or None. ``device_types`` are the device types
    of a group it answers for (default: every type but ``cpu``); ``clear(device)`` is what the
    guard does after ``gc.collect()`` when memory is low (default: synchronize and empty the
    device's cache).
    """
    global _probe, _probe_types, _clear
    if probe is not None and not callable(probe):
        raise TypeError(f"set_memory_probe() takes a callable or None, got {type(probe).__name__}")
    if clear is not None and not callable(clear):
        raise TypeError(f"clear must be a callable or None, got {type(clear).__name__}")
    types = None
    if device_types is not None:
        if isinstance(device_types, str):
            device_types = (device_types,)
        types = frozenset(str(t) for t in device_types)
    with _lock:
        _probe, _probe_types, _clear = probe, types, clear


def set_memory_guard(min_free_gb: float = DEFAULT_MIN_FREE_GB, *, every_call: bool = False) -> None:
    """Check free accelerator memory before a reloaded group's first collective.

    Below ``min_free_gb`` GiB free, the guard collects garbage and empties the allocator's
    cache; ``0`` turns it off. ``every_call=True`` checks before every collective on an
    accelerator group, as slime does (a device query per call).
    """
    global _guard
    value = _check_gb(min_free_gb)
    if not isinstance(every_call, bool):
        raise TypeError(f"every_call must be True or False, got {every_call!r}")
    with _lock:
        _guard = MemoryGuard(value, every_call)
    if every_call and value > 0:
        _arm_live_groups()


def _arm_live_groups() -> None:
    """Every call is checked from now on: arm the live reloadable groups (and WORLD's)."""
    from . import state
    from .record import State

    holder = state.current()
    for record in holder.records:
        if record.state is State.LIVE:
            arm(record.wrapper)
    if holder.world is not None:
        arm(holder.world.stand_in)


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
    if not value >= 0:  # also NaN
        raise ValueError(f"min_free_gb must be 0 (off) or more GiB, got {value!r}")
    return float(value)


def probe_is_default() -> bool:
    """Whether the memory figures come from torch's own query (no ``set_memory_probe``)."""
    return _probe is None


def get_memory_guard() -> MemoryGuard:
    """The guard's settings now (from the environment until ``set_memory_guard``)."""
    global _guard
    guard = _guard
    if guard is None:
        guard = _from_environment()
        with _lock:
            if _guard is None:
                _guard = guard
            guard = _guard
    return guard


def _from_environment() -> MemoryGuard:
    """``SLIME_RELOADABLE_PG_MIN_FREE_GB`` and ``..._MEMORY_GUARD_EVERY_CALL``; bad values warn."""
    min_free = DEFAULT_MIN_FREE_GB
    raw = os.environ.get(_env.MIN_FREE_ENV)
    if raw is not None and raw.strip():
        try:
            min_free = _env.parse_min_free_gb(raw)
        except ValueError as error:
            logger.warning("%s; using the default, %s GiB", error, DEFAULT_MIN_FREE_GB)
    every = False
    raw = os.environ.get(_env.EVERY_CALL_ENV)
    if raw is not None:
        value = raw.strip().lower()
        if value in _env.ON_VALUES:
            every = True
        elif value not in _env.OFF_VALUES:
            logger.warning(
                "%s=%s is not understood; accepted: %s (on) or %s (off); the guard checks "
                "once per group after each reload",
                _env.EVERY_CALL_ENV,
                _env.excerpt(raw),
                ", ".join(_env.ON_VALUES),
                ", ".join(repr(v) for v in _env.OFF_VALUES),
            )
    return MemoryGuard(min_free, every)


def device_of(native: Any) -> torch.device | None:
    """The device whose memory the probe answers for in ``native``'s backends, if any.

    With torch's own query: the accelerator of a group whose backend holds accelerator memory
    (``nccl``, not ``gloo``, which also lists ``cuda``), where that device is present. With a
    supplied probe: the first of the group's device types it answers for.
    """
    types = _probe_types
    try:
        device_types = native._device_types
        backend = native._get_backend_name() if types is None else None
    except Exception:
        return None
    if types is None and not holds_accelerator_memory(backend):
        return None
    for device in device_types:
        kind = device.type if isinstance(device, torch.device) else str(device)
        if types is None:
            if kind != "cpu" and _present(kind):
                return _current(kind)
        elif kind in types:
            return _current(kind)
    return None


def _present(kind: str) -> bool:
    module = _device_module(kind)
    try:
        return module is not None and bool(module.is_available())
    except Exception:
        return False


def _current(kind: str) -> torch.device:
    module = _device_module(kind)
    current = getattr(module, "current_device", None)
    if kind == "cpu" or current is None:
        return torch.device(kind)
    try:
        return torch.device(kind, current())
    except Exception:  # no such device here: the probe says so
        return torch.device(kind)


def figures(device: torch.device | None) -> MemoryFigures | None:
    """The probe's figures for ``device`` (None: no device, no figures, or the query failed)."""
    if device is None:
        return None
    probe = _probe or default_probe
    try:
        result = probe(device)
    except Exception as error:
        logger.debug("the memory query for %s failed: %s", device, error)
        return None
    return result if isinstance(result, MemoryFigures) else None


def primary_device() -> torch.device | None:
    """The device a cycle report gives figures for: the current accelerator, or the probe's."""
    types = _probe_types
    if types is not None:
        kind = sorted(types)[0]
        return _current(kind)
    for kind in ("cuda", "xpu"):
        if _present(kind):
            return _current(kind)
    return None


def armed_device(native: Any) -> torch.device | None:
    """The device to check before ``native``'s first collective after a reload, if any."""
    if get_memory_guard().min_free_gb <= 0:
        return None
    return device_of(native)


def check(device: torch.device, label: str) -> None:
    """The guard: below the threshold, collect garbage and empty the device's cache."""
    guard = get_memory_guard()
    if guard.min_free_gb <= 0:
        return
    now = figures(device)
    if now is None or now.free >= guard.min_free_gb * GiB:
        return
    logger.info(
        "%.2f GiB free on %s before the first collective on %s (below %.2f GiB): collecting "
        "garbage and emptying the cache",
        now.free / GiB,
        device,
        label,
        guard.min_free_gb,
    )
    gc.collect()
    clear = _clear or default_clear
    try:
        clear(device)
    except Exception as error:
        logger.warning("emptying the cache of %s failed: %s", device, error)


NOTE_PREFIX = "reloadpg_autopatch: accelerator memory"


def note(error: BaseException, native: Any) -> None:
    """Add the device's memory figures to ``error``, raised by a collective on ``native``."""
    if any(str(n).startswith(NOTE_PREFIX) for n in getattr(error, "__notes__", ())):
        return  # a wrapped function called inside another one already said it
    try:
        if native is None:
            from torch.distributed import distributed_c10d as c10d

            native = c10d._world.default_pg
            native = getattr(native, "group", native)
        device = device_of(native) if native is not None else None
        now = figures(device)
        if now is None:
            return
        name = getattr(native, "group_name", "?")
        text = (
            f"{NOTE_PREFIX} on {device} when this collective on group "
            f"{name!r} (size {native.size()}) failed: {now.describe()}"
        )
    except Exception:  # the error path must raise the program's error, not ours
        return
    add = getattr(error, "add_note", None)
    if add is not None:
        add(text)
    else:  # Python 3.10
        error.__notes__ = [*getattr(error, "__notes__", ()), text]
