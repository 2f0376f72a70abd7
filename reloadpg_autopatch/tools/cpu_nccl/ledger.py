"""The model's bookkeeping: every backend it made and every call that reached one.

What a test, the demo or a benchmark reads afterwards: which backends exist (kept referenced:
torch 2.13 forgets a Python ``ProcessGroupGloo`` subclass that nobody references and hands back
the plain C++ class), how many times a creator ran (a cycle that rendezvoused again shows
here), and the call log.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any

#: Every backend this process created, in creation order. Keeps the Python objects alive: on
#: torch 2.13 a variant-A backend nobody references comes back from ``_get_backend`` as the
#: plain C++ ``ProcessGroupGloo``.
BACKENDS: list[Any] = []
#: Every call that reached a backend in this process (lifecycle calls on both variants, and
#: collectives on variant B or through ``accelerator_tensor``), in order.
CALLS: list[Call] = []
_CREATED: collections.Counter[str] = collections.Counter()
_lock = threading.Lock()

#: The calls of NCCL's suspend API and the comm's own life; every other op is a collective.
LIFECYCLE = frozenset({"suspend", "resume", "memory_stats", "abort", "shutdown"})


@dataclasses.dataclass(frozen=True)
class Call:
    """One call that reached a suspendable backend."""

    backend: str  # "<name>#<serial>"
    op: str  # "suspend", "resume", "memory_stats", "allreduce", ...
    state: str  # the backend's state when the call came: "awake", "suspended", ...
    outcome: str  # "ok", "refused" (a collective while not awake) or "raised: <first line>"
    devices: tuple[str, ...] = ()  # the device types of the call's tensors


def track(backend: Any) -> Any:
    """Keep ``backend`` referenced and count its creation under its ``registered_name``: what
    every creator of the model (and of a variant built on it) returns."""
    with _lock:
        BACKENDS.append(backend)
        _CREATED[backend.registered_name] += 1
    return backend


def calls(op: str | None = None, *, backend: Any = None, outcome: str | None = None) -> list[Call]:
    """The call log, filtered by op, backend (object or label) and outcome prefix."""
    label = backend if isinstance(backend, str) else getattr(backend, "label", backend)
    return [
        c
        for c in CALLS
        if (op is None or c.op == op)
        and (label is None or c.backend == label)
        and (outcome is None or c.outcome.startswith(outcome))
    ]


def collectives(*, refused: bool | None = None) -> list[Call]:
    """Every collective in the log (lifecycle calls left out); ``refused`` filters."""
    out = [c for c in CALLS if c.op not in LIFECYCLE]
    if refused is not None:
        out = [c for c in out if (c.outcome == "refused") == refused]
    return out


def creations(name: str | None = None) -> int:
    """How many times a creator of the model ran in this process (for one name, or all)."""
    return _CREATED[name] if name is not None else sum(_CREATED.values())


def backends(name: str | None = None) -> list[Any]:
    """The backends this process created (for one registered name, or all)."""
    return [b for b in BACKENDS if name is None or b.registered_name == name]


def forget() -> None:
    """Forget the call log and the creation counts (the backends stay referenced)."""
    CALLS.clear()
    _CREATED.clear()
