"""Which backends hold accelerator memory, as the installed torch registers them.

``Backend.backend_capability`` maps each backend to the device types it serves: ``gloo``, ``ucc``
and ``mpi`` list ``cpu`` and ``cuda``, ``nccl`` only ``cuda``, ``xccl`` only ``xpu``, and a
backend registered later (torch 2.14's ``nccl2``, a vendor plugin) lists what it was registered
with. A backend that serves no CPU device can only hold accelerator memory, so that is the rule:
no list of names to keep up to date.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist


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


#: gloo's switch for connecting pairs on first use instead of a full mesh at creation (read
#: when the group's device is created, on torch 2.13 and 2.14 alike).
LAZY_GLOO = "TORCH_GLOO_LAZY_INIT"


_lazy_lock = threading.Lock()
_lazy_depth = 0
_lazy_saved: str | None = None


@contextlib.contextmanager
def lazy_gloo(enabled: bool = True) -> Iterator[None]:
    """gloo groups created in the block connect a pair only when it first communicates.

    The temporary WORLD of a swap is rarely used: created eagerly, it costs every rank a
    connection to every other rank (N² in all) each cycle, for nothing. The variable is put
    back exactly as it was, set or unset, also when ranks run as threads of one process (the
    first to enter saves it, the last to leave restores it).
    """
    global _lazy_depth, _lazy_saved
    if not enabled:
        yield
        return
    with _lazy_lock:
        if _lazy_depth == 0:
            _lazy_saved = os.environ.get(LAZY_GLOO)
        _lazy_depth += 1
        os.environ[LAZY_GLOO] = "1"
    try:
        yield
    finally:
        with _lazy_lock:
            _lazy_depth -= 1
            if _lazy_depth == 0:
                if _lazy_saved is None:
                    os.environ.pop(LAZY_GLOO, None)
                else:
                    os.environ[LAZY_GLOO] = _lazy_saved
