"""What the installed torch says of a group's backends: which hold accelerator memory, and the
timeout a group runs with.

``Backend.backend_capability`` maps each backend to the device types it serves: ``gloo``, ``ucc``
and ``mpi`` list ``cpu`` and ``cuda``, ``nccl`` only ``cuda``, ``xccl`` only ``xpu``, and a
backend registered later (torch 2.14's ``nccl2``, a vendor plugin) lists what it was registered
with. A backend that serves no CPU device can only hold accelerator memory, so that is the rule:
no list of names to keep up to date.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d


def component_names(backend: object) -> tuple[str, ...]:
    """The backend names inside a backend string such as ``"cpu:gloo,cuda:nccl"``."""
    names = []
    for part in str(backend).lower().split(","):
        name = part.rsplit(":", 1)[-1].strip()
        if name:
            names.append(name)
    return tuple(names)


def serves_only_accelerators(name: str) -> bool:
    """Whether torch registered backend ``name`` for no CPU device (unknown names: False)."""
    devices = dist.Backend.backend_capability.get(name.lower())
    return bool(devices) and "cpu" not in devices


def holds_accelerator_memory(backend: object) -> bool:
    """Whether a backend in ``backend`` (``"nccl"``, ``"cpu:gloo,cuda:nccl"``) needs no CPU."""
    return any(serves_only_accelerators(name) for name in component_names(backend))


def device_backends(group: Any) -> Iterator[tuple[Any, Any]]:
    """``(device, backend)`` for each device type of a native group that has a backend now."""
    for device in getattr(group, "_device_types", ()):
        try:
            backend = group._get_backend(device)
        except RuntimeError:  # torch has no backend for that device (yet, or any more)
            continue
        yield device, backend


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
