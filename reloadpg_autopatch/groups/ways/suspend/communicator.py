"""What a communicator says of itself before suspend touches it: made yet, and blocking.

torch 2.15's default ``nccl`` (nccl2) brings two kinds of communicator the classic backend
did not have; both are answered from what the backend says, never from its name:

- ``lazy_init`` (``ProcessGroupNCCL.Options.lazy_init``, nccl2 only: "create the
  communicator on the first operation"). nccl2's ``getMemoryStats()``, ``suspend()`` and
  ``resume()`` begin with ``checkInitialized()``, which *creates* a lazy communicator: a
  collective bootstrap, so a probe that is local and cheap elsewhere would make one rank wait
  alone for its peers. A lazy communicator that does not say it exists is therefore answered
  "not initialized" without asking it, as the classic backend's uninitialized communicator
  answers itself: guarded while asleep, never suspended, until it says it exists.
- nonblocking communicators. nccl2's ``reconfigure()`` makes every communicator it creates
  nonblocking (``config.blocking = 0`` on a local copy: the group's options still say
  "unset"), and a nonblocking communicator's ``ncclCommSuspend`` returns ``ncclInProgress``,
  which torch raises as an error. A group created with ``enable_reconfigure=True`` gets its
  communicator from ``reconfigure()``; ``config.blocking=0`` and
  ``TORCH_NCCL_USE_COMM_NONBLOCKING`` (``capability.environment_refusal``) say so too. Such a
  group cannot suspend: ``auto`` takes another way for it, ``suspend`` refuses it by name.

The 2.15 facts were read from torch's source, not run (no 2.15 here): the Python name of
``Backend::isInitialized()`` is unverified (each spelling below is asked; the classic backend
binds ``_is_initialized``), and so is the ``lazy_init`` option's (read with ``getattr``).
"""

from __future__ import annotations

import contextlib
from typing import Any

#: How a backend may say whether its communicator exists (2.15: unverified; classic: the last).
INITIALIZED = ("is_initialized", "isInitialized", "_is_initialized")
#: What a nonblocking communicator's suspend or resume raises (NCCL's ``ncclInProgress``).
IN_PROGRESS = "in progress"


def _options(backend: Any) -> Any:
    try:
        return getattr(backend, "options", None)
    except Exception:  # a backend torch cannot describe: it says nothing
        return None


def initialized(backend: Any) -> bool | None:
    """Whether ``backend`` says its communicator exists (None: it does not say)."""
    for name in INITIALIZED:
        answer = getattr(backend, name, None)
        if callable(answer):
            with contextlib.suppress(Exception):
                return bool(answer())
    return None


def lazy_uninitialized(backend: Any) -> str | None:
    """Why ``backend`` must not be probed yet (a ``lazy_init`` communicator that does not say
    it exists), or None."""
    if getattr(_options(backend), "lazy_init", False) is not True:
        return None
    if initialized(backend) is True:
        return None
    return (
        "not initialized (lazy_init: its communicator is made by its first collective, and "
        "memory_stats() would make it)"
    )


def nonblocking(backend: Any) -> str | None:
    """Why ``backend``'s communicator is nonblocking, where its options say so, or None."""
    options = _options(backend)
    if getattr(options, "enable_reconfigure", False) is True:
        return (
            "it was created with enable_reconfigure=True, so its communicator comes from "
            "reconfigure(), which nccl2 makes nonblocking: a nonblocking communicator's "
            "suspend returns 'in progress' (ncclInProgress), which torch raises"
        )
    return None


def in_progress(error: BaseException) -> bool:
    """Whether ``error`` is NCCL's "in progress" (a nonblocking communicator's answer)."""
    return IN_PROGRESS in str(error).lower()
