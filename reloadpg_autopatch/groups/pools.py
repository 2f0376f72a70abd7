"""Memory pools registered on a reloadable group's backend, registered again after reload.

Megatron's NCCL allocator (``nccl_allocator.py``) calls ``group._get_backend(device)
.register_mem_pool(pool)`` once per pool; the registration lives in the communicator, which a
destroy frees. A backend handed out by a reloadable group is tracked; the first time one of a
class with ``register_mem_pool`` is seen, the class's ``register_mem_pool`` and
``deregister_mem_pool`` are taught to tell the group's record, and reload replays what is still
registered on the new backend. Backends that were not handed out by a reloadable group behave
exactly as before.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from .record import Record

logger = logging.getLogger("reloadpg_autopatch")

#: ``id(backend)`` -> (backend, record, device): the backends reloadable groups handed out.
_handed: dict[int, tuple[Any, Record, Any]] = {}
_patched: set[type] = set()
_lock = threading.Lock()

REGISTER = "register_mem_pool"
DEREGISTER = "deregister_mem_pool"
#: The entry a registration leaves in ``Record.hooks``.
ENTRY = "backend.register_mem_pool"


def track(backend: Any, record: Record, device: Any) -> None:
    """``backend`` was handed out by the reloadable group of ``record`` for ``device``."""
    cls = type(backend)
    if not hasattr(cls, REGISTER):
        return
    with _lock:
        if len(_handed) > 1024:  # backends of destroyed incarnations: drop the dead ones
            for key in [k for k, v in _handed.items() if v[1].native is None]:
                del _handed[key]
        _handed[id(backend)] = (backend, record, device)
        if cls not in _patched:
            _patched.add(cls)
            with contextlib.suppress(TypeError, AttributeError):  # takes no new attributes
                _teach(cls)


def _owner(backend: Any) -> tuple[Record, Any] | None:
    entry = _handed.get(id(backend))
    if entry is None or entry[0] is not backend:
        return None
    return entry[1], entry[2]


#: The class's own ``(register_mem_pool, deregister_mem_pool)``, for the lifecycle's calls.
_originals: dict[type, tuple[Any, Any]] = {}


def _teach(cls: type) -> None:
    register = getattr(cls, REGISTER)
    deregister = getattr(cls, DEREGISTER, None)
    _originals[cls] = (register, deregister)

    def register_mem_pool(self: Any, pool: Any, *args: Any, **kwargs: Any) -> Any:
        again = _replayed.get((id(self), id(pool)))
        if again is not None and again[0] is self and again[1] is pool:
            # Reload registered it again already; a framework's own hook doing the same
            # afterwards must not register it twice.
            return None
        result = register(self, pool, *args, **kwargs)
        owner = _owner(self)
        if owner is not None:
            record, device = owner
            record.hooks.append((ENTRY, (device, pool, *args), kwargs))
        return result

    register_mem_pool.__doc__ = register.__doc__
    setattr(cls, REGISTER, register_mem_pool)
    if deregister is None:
        return

    def deregister_mem_pool(self: Any, pool: Any, *args: Any, **kwargs: Any) -> Any:
        result = deregister(self, pool, *args, **kwargs)
        _replayed.pop((id(self), id(pool)), None)
        owner = _owner(self)
        if owner is not None:
            record = owner[0]
            record.hooks[:] = [h for h in record.hooks if not (h[0] == ENTRY and h[1][1] is pool)]
        return result

    deregister_mem_pool.__doc__ = deregister.__doc__
    setattr(cls, DEREGISTER, deregister_mem_pool)


#: ``(id(backend), id(pool))`` -> (backend, pool) registered again by the reload running now.
_replayed: dict[tuple[int, int], tuple[Any, Any]] = {}


def begin_reload() -> None:
    """Forget the previous reload's registrations (held until now so that ids stay unique)."""
    _replayed.clear()


def _kept(record: Record) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    return [entry for entry in record.hooks if entry[0] == ENTRY]


def release(record: Record, label: str) -> None:
    """Deregister the record's kept pools from its backend before its communicator is freed.

    NCCL's abort deregisters what is still registered and fails on handles it cannot find
    (Megatron deregisters its pools before destroying its groups for that reason). The entries
    stay on the record: reload registers them again.
    """
    native = record.native
    for _name, (device, pool, *_rest), _kwargs in _kept(record):
        try:
            backend = native._get_backend(device)
            deregister = _originals[type(backend)][1]
            if deregister is not None:
                deregister(backend, pool)
        except Exception as error:
            logger.warning("could not deregister memory pool %r from %s: %s", pool, label, error)


def replay(native: Any, entry: tuple[str, tuple[Any, ...], dict[str, Any]], label: str) -> None:
    """Register a kept memory pool on ``native``'s backend for its device.

    A failure is logged, not raised: the group works without the registration (NCCL copies
    through its own buffers), and a reload that stopped halfway would strand the other ranks.
    """
    _name, (device, pool, *rest), kwargs = entry
    try:
        backend = native._get_backend(device)
        _originals[type(backend)][0](backend, pool, *rest, **kwargs)
    except Exception as error:
        logger.warning("could not register memory pool %r on %s again: %s", pool, label, error)
        return
    _replayed[(id(backend), id(pool))] = (backend, pool)
