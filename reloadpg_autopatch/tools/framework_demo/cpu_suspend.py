"""The demo's CPU model of NCCL's suspend: a gloo backend that answers torch's ``suspend()``,
``resume()`` and ``memory_stats()`` as an NCCL communicator does.

No GPU is needed for the demo, and gloo holds no accelerator memory, so the suspend mode would
leave every gloo group awake. ``cpu_suspend`` is gloo for every collective, and a pretend
communicator buffer that ``suspend()`` copies to a host backup and frees and ``resume()``
restores (refusing a second suspend, or a resume while awake, as NCCL does). The package asks
it, as it asks NCCL, whether it can suspend. Counts per backend are what the demo reports.
"""

from datetime import timedelta
from typing import Any

import torch.distributed as dist

NAME = "cpu_suspend"
#: The pretend communicator buffer each backend frees while suspended, and what stays.
BUFFER_BYTES = 4 * 2**20
PERSIST_BYTES = 256 * 2**10
#: Every backend made in this process, in order (torch 2.13 forgets a Python subclass that
#: nobody references, and the demo reads their counts).
BACKENDS: list = []


class CpuSuspendGloo(dist.ProcessGroupGloo):
    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(store, rank, size, timeout)
        self.buffer: bytearray | None = bytearray(BUFFER_BYTES)
        self.backup: bytes | None = None
        self.suspends = self.resumes = 0

    def memory_stats(self) -> dict:
        return {
            "suspend": BUFFER_BYTES,
            "suspended": int(self.buffer is None),
            "persist": PERSIST_BYTES,
            "total": BUFFER_BYTES + PERSIST_BYTES,
        }

    def suspend(self) -> None:
        if self.buffer is None:
            raise dist.DistBackendError("ncclInvalidUsage: Already suspended")
        self.backup, self.buffer = bytes(self.buffer), None
        self.suspends += 1

    def resume(self) -> None:
        if self.buffer is not None:
            raise dist.DistBackendError("ncclInvalidUsage: Not in suspended state")
        self.buffer, self.backup = bytearray(self.backup or b""), None
        self.resumes += 1


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> CpuSuspendGloo:
    backend = CpuSuspendGloo(store, rank, size, timeout)
    BACKENDS.append(backend)
    return backend


def register() -> str:
    """Register ``cpu_suspend`` with torch (once per process); returns its name."""
    if NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(NAME, _create, devices=["cpu"])
    return NAME
