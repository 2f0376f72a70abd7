"""How torch meets the model: its creators, their registration, and a reset for the next test.

torch makes a backend through the creator registered under a name
(``dist.Backend.register_backend(name, creator, devices=...)``); every creator here returns its
backend through ``ledger.track``, so that it stays referenced and its creation is counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from .device import clear as clear_device
from .gloo_subclass import NAME_A, SuspendableGloo
from .ledger import forget, track
from .python_backend import NAME_B, SuspendablePy, python_backend_available
from .switches import check_names
from .switches import clear as clear_switches


def create_a(store: Any, rank: int, size: int, timeout: timedelta) -> SuspendableGloo:
    """The creator registered for ``"suspendable"`` (torch's four-argument creator API)."""
    return track(SuspendableGloo(store, rank, size, timeout))


def create_b(store: Any, rank: int, size: int, timeout: timedelta) -> SuspendablePy:
    """The creator registered for ``"suspendable_py"``."""
    return track(SuspendablePy(store, rank, size, timeout))


def register(devices: Iterable[str] = ("cpu",)) -> list[str]:
    """Register ``"suspendable"`` (and ``"suspendable_py"`` where it can exist); return names.

    ``devices`` is what ``new_group(backend="suspendable")`` gives the backend; a mixed group
    names its legs itself (``"cpu:gloo,privateuseone:suspendable"``), whatever ``devices`` says.
    """
    devices = list(devices)
    dist.Backend.register_backend(NAME_A, create_a, devices=devices)
    names = [NAME_A]
    if python_backend_available():
        dist.Backend.register_backend(NAME_B, create_b, devices=devices)
        names.append(NAME_B)
    return names


def creator(cls: type = SuspendableGloo, name: str = NAME_A, **defaults: Any) -> Callable[..., Any]:
    """A creator of ``cls`` (variant A or B, or a subclass) registered as ``name``, whose
    backends start from ``defaults`` (``Settings`` fields; the environment and ``configure()``
    still win)."""
    check_names(defaults, "creator")

    def create(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
        return track(cls(store, rank, size, timeout, name=name, defaults=defaults))

    return create


def register_variant(
    name: str,
    cls: type = SuspendableGloo,
    *,
    devices: Iterable[str] = ("cpu",),
    **defaults: Any,
) -> str:
    """Register the model under a name of its own with switches of its own (the demo's
    ``cpu_suspend``: bigger buffers); returns the name."""
    dist.Backend.register_backend(name, creator(cls, name, **defaults), devices=list(devices))
    return name


def reset() -> None:
    """Forget the call log, the creation counts, ``configure()`` and the pretend device's
    settings (backends stay alive and referenced)."""
    forget()
    clear_switches()
    clear_device()
