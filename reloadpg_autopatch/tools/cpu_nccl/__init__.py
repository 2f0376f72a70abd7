"""A CPU model of an NCCL communicator's suspend: ``suspend()``, ``resume()`` and
``memory_stats()`` on gloo, the one model the tests, the demo and the benchmarks use.

No GPU exists where the suite runs, nor on a laptop running ``make demo``, so this stands in
for an NCCL communicator that ``ncclCommSuspend`` / ``ncclCommResume`` / ``ncclCommMemStats``
drive (torch's ``Backend.suspend`` / ``resume`` / ``memory_stats``), following NCCL's protocol
as its source describes it (``protocol``; where that was inferred, not observed:
``docs/suspend-facts.md``, "The stand-in's model choices"). It ships in the package because the
demo does and must run from an installed wheel; nothing below ``tools/`` imports it.

Importing it registers its two variants with torch, as a backend plugin's import does:

- **A, ``"suspendable"``** (torch 2.13 and 2.14): :class:`SuspendableGloo`, a Python subclass of
  ``ProcessGroupGloo`` (``gloo_subclass``): lifecycle calls reach Python, collectives do not.
- **B, ``"suspendable_py"``** (torch 2.14 only; :func:`python_backend_available`):
  :class:`SuspendablePy`, a pure-Python ``Backend`` (``python_backend``): collectives reach
  Python, are logged, and are refused while suspended.

By job: ``switches`` (what a backend does: ``configure``, the ``SUSPENDABLE_*`` variables,
a variant's defaults), ``protocol`` (the suspend protocol both variants share), ``wording``
(NCCL's errors as torch raises them), ``ledger`` (the backends made, the creation counts and
the call log), ``device`` (the pretend device and ``memory_probe``), ``accelerator`` (tensors
that say they live on an accelerator, for mixed groups), ``registration`` (the creators, a
variant of one's own with ``register_variant``, ``reset``). A variant built on the model (the
tests' nccl2 stand-ins, ``tests/support/nccl2.py``) subclasses a variant and returns its
backends through :func:`track`.
"""

from .accelerator import ACCELERATOR, AcceleratorTensor, accelerator_tensor
from .device import (
    device_memory,
    host_backup_bytes,
    memory_probe,
    occupy,
    resident_bytes,
    set_device_total,
)
from .gloo_subclass import NAME_A, SuspendableGloo
from .ledger import BACKENDS, CALLS, LIFECYCLE, Call, backends, calls, collectives, creations, track
from .protocol import SuspendProtocol
from .python_backend import NAME_B, PYTHON_BACKEND_REASON, SuspendablePy, python_backend_available
from .registration import create_a, create_b, creator, register, register_variant, reset
from .switches import GiB, KiB, MiB, Settings, configure, settings_for
from .wording import (
    ALREADY_SUSPENDED,
    ILLEGAL_ADDRESS,
    NCCL_VERSION,
    NOT_SUSPENDED,
    SPLIT_SHARE,
    UNINITIALIZED_CLASSIC,
    UNINITIALIZED_NCCL2,
)

__all__ = [
    "ACCELERATOR",
    "ALREADY_SUSPENDED",
    "BACKENDS",
    "CALLS",
    "ILLEGAL_ADDRESS",
    "LIFECYCLE",
    "NAME_A",
    "NAME_B",
    "NCCL_VERSION",
    "NOT_SUSPENDED",
    "PYTHON_BACKEND_REASON",
    "SPLIT_SHARE",
    "UNINITIALIZED_CLASSIC",
    "UNINITIALIZED_NCCL2",
    "AcceleratorTensor",
    "Call",
    "GiB",
    "KiB",
    "MiB",
    "Settings",
    "SuspendProtocol",
    "SuspendableGloo",
    "SuspendablePy",
    "accelerator_tensor",
    "backends",
    "calls",
    "collectives",
    "configure",
    "create_a",
    "create_b",
    "creations",
    "creator",
    "device_memory",
    "host_backup_bytes",
    "memory_probe",
    "occupy",
    "python_backend_available",
    "register",
    "register_variant",
    "reset",
    "resident_bytes",
    "set_device_total",
    "settings_for",
    "track",
]

register()
