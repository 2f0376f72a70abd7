"""The pretend device: free bytes that go down and up with the model's real CPU buffers.

CPU has no accelerator memory, so the package's memory guard and its reload preflight would
have nothing to read. Each backend holds real buffers (its suspendable and resident bytes);
this device's free bytes are its size less another tenant's share less those buffers, and
``memory_probe`` hands them to ``reloadpg_autopatch.set_memory_probe``.
"""

from __future__ import annotations

import os
from typing import Any

from .ledger import BACKENDS
from .switches import GiB


class _Device:
    def __init__(self) -> None:
        self.total: int | None = None
        self.occupied: int | None = None

    def sizes(self) -> tuple[int, int]:
        total = self.total
        if total is None:
            total = int(os.environ.get("SUSPENDABLE_DEVICE_TOTAL", str(GiB)))
        occupied = self.occupied
        if occupied is None:
            occupied = int(os.environ.get("SUSPENDABLE_DEVICE_OCCUPIED", "0"))
        return total, occupied


_device = _Device()


def set_device_total(nbytes: int | None) -> None:
    """Size the pretend device (None: ``SUSPENDABLE_DEVICE_TOTAL`` or 1 GiB)."""
    _device.total = nbytes


def occupy(nbytes: int | None) -> None:
    """Let another tenant hold ``nbytes`` of the pretend device (None: the environment's)."""
    _device.occupied = nbytes


def clear() -> None:
    """Back to the environment's (or the default) size and tenant."""
    _device.total = None
    _device.occupied = None


def resident_bytes() -> int:
    """Bytes the backends of this process hold on the pretend device now (real buffers)."""
    return sum(b._resident() for b in BACKENDS)


def host_backup_bytes() -> int:
    """Host bytes suspended backends hold (NCCL: the pinned host copies)."""
    return sum(len(b._backup) for b in BACKENDS if b._backup is not None)


def device_memory() -> tuple[int, int]:
    """``(free, total)`` bytes of the pretend device, like ``torch.cuda.mem_get_info``."""
    total, occupied = _device.sizes()
    return max(0, total - occupied - resident_bytes()), total


def memory_probe(device: Any = None) -> Any:
    """A probe for ``reloadpg_autopatch.set_memory_probe``: the pretend device's figures, as
    ``reloadpg_autopatch.MemoryFigures``. The pretend device is one per process, whatever
    ``device`` is asked about."""
    from ... import MemoryFigures  # the public name, loaded on first use

    free, total = device_memory()
    used = resident_bytes() + _device.sizes()[1]
    return MemoryFigures(free, total, resident_bytes(), used)
