"""Accelerator memory: the query, the device a group's memory is on, and notes on errors.

CPU has no accelerator memory to ask about, and a framework may keep its own accounting, so
the query is replaceable (``set_memory_probe``). The guard that acts on the figures (before a
reloaded group's first collective) is ``guard``; the cycle report records them (``report``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch

from . import settings
from .backends import holds_accelerator_memory

logger = logging.getLogger("reloadpg_autopatch")

GiB = float(2**30)


def human(nbytes: float) -> str:
    """Bytes for a message: GiB from 1 GiB up, else MiB, else KiB."""
    for unit, size in (("GiB", GiB), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if abs(nbytes) >= size or unit == "KiB":
            return f"{nbytes / size:.2f} {unit}"
    raise AssertionError("unreachable")


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


Probe = Callable[["torch.device"], "MemoryFigures | None"]


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
    if probe is not None and not callable(probe):
        raise TypeError(f"set_memory_probe() takes a callable or None, got {type(probe).__name__}")
    if clear is not None and not callable(clear):
        raise TypeError(f"clear must be a callable or None, got {type(clear).__name__}")
    types = None
    if device_types is not None:
        if isinstance(device_types, str):
            device_types = (device_types,)
        types = frozenset(str(t) for t in device_types)
    held = settings.current()
    with held.lock:
        held.probe, held.probe_types, held.clear = probe, types, clear


def probe_is_default() -> bool:
    """Whether the memory figures come from torch's own query (no ``set_memory_probe``)."""
    return settings.current().probe is None


def clear(device: torch.device) -> None:
    """Make room on ``device``: the ``clear`` given to ``set_memory_probe``, or the default."""
    chosen = settings.current().clear or default_clear
    chosen(device)


def device_of(native: Any) -> torch.device | None:
    """The device whose memory the probe answers for in ``native``'s backends, if any.

    With torch's own query: the accelerator of a group whose backend holds accelerator memory
    (``nccl``, not ``gloo``, which also lists ``cuda``), where that device is present. With a
    supplied probe: the first of the group's device types it answers for.
    """
    types = settings.current().probe_types
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
                return current_device(kind)
        elif kind in types:
            return current_device(kind)
    return None


def _present(kind: str) -> bool:
    module = _device_module(kind)
    try:
        return module is not None and bool(module.is_available())
    except Exception:
        return False


def current_device(kind: str) -> torch.device:
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
    probe = settings.current().probe or default_probe
    try:
        result = probe(device)
    except Exception as error:
        logger.debug("the memory query for %s failed: %s", device, error)
        return None
    return result if isinstance(result, MemoryFigures) else None


def primary_device() -> torch.device | None:
    """The device a cycle report gives figures for: the current accelerator, or the probe's."""
    types = settings.current().probe_types
    if types is not None:
        kind = sorted(types)[0]
        return current_device(kind)
    for kind in ("cuda", "xpu"):
        if _present(kind):
            return current_device(kind)
    return None


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
