"""Variant A, ``"suspendable"`` (torch 2.13 and 2.14): a Python subclass of ``ProcessGroupGloo``.

``group._get_backend(torch.device("cpu"))`` returns the Python object, so ``suspend`` /
``resume`` / ``memory_stats`` reach Python; collectives run in C++ gloo and never reach Python,
so this variant cannot refuse one while suspended (the package's guard must fire first). torch
2.13 forgets a Python subclass whose object nobody references (it hands back the plain C++
``ProcessGroupGloo``); ``ledger.BACKENDS`` keeps every one referenced.

A variant built on it (the demo's ``cpu_suspend``, the tests' nccl2 stand-ins) subclasses it or
registers it under a name of its own with defaults of its own (``register_variant``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .protocol import SuspendProtocol

NAME_A = "suspendable"


class SuspendableGloo(SuspendProtocol, dist.ProcessGroupGloo):
    """Variant A: gloo in C++ for collectives; suspend / resume / memory_stats in Python.

    ``name`` is the name it was registered under (its ``registered_name``, its calls' label);
    ``defaults`` are its variant's switches, below the environment and ``configure()``.
    """

    def __init__(
        self,
        store: Any,
        rank: int,
        size: int,
        timeout: timedelta,
        *,
        name: str = NAME_A,
        defaults: dict[str, Any] | None = None,
    ) -> None:
        dist.ProcessGroupGloo.__init__(self, store, rank, size, timeout)
        self._protocol_init(name, rank, size, defaults)
        # A group of its own whose CPU backend is this gloo: accelerator_tensor() runs
        # collectives of a pretend accelerator leg through it. No store traffic.
        self._shadow = dist.ProcessGroup(store, rank, size)
        self._shadow._register_backend(
            torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, self
        )

    def _gloo_backend(self) -> Any:
        return super(SuspendProtocol, self)  # ProcessGroupGloo's own methods
