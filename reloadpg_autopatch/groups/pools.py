"""Memory pools registered on a reloadable group's backend, registered again after reload.

Megatron's NCCL allocator (``nccl_allocator.py``) calls ``group._get_backend(device)
.register_mem_pool(pool)`` once per pool; the registration lives in the communicator, which a
destroy frees. A backend handed out by a reloadable group is tracked; the first time one of a
class with ``register_mem_pool`` is seen, the class's ``register_mem_pool`` and
``deregister_mem_pool`` are taught to tell the group's record, and reload replays what is still
registered on the new backend. Backends that were not handed out by a reloadable group behave
exactly as before.

What this process handed out and registered again is per process (``process.ProcessState``'s
``pools``, which this module alone writes); what a class was taught is kept on the class
itself, so a forked child, whose classes are the parent's, never teaches one twice.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from . import process
from .record import Record

logger = logging.getLogger("reloadpg_autopatch")

REGISTER = "register_mem_pool"
DEREGISTER = "deregister_mem_pool"
#: The entry a registration leaves in ``Record.replays``.
ENTRY = "backend.register_mem_pool"
#: Set on a class once taught: its own ``(register_mem_pool, deregister_mem_pool)``.
ORIGINALS = "__reloadpg_mem_pool_originals__"


def track(backend: Any, record: Record, device: Any) -> None:
    """``backend`` was handed out by the reloadable group of ``record`` for ``device``."""
    cls = type(backend)
    if not hasattr(cls, REGISTER):
        return
    holder = process.current()
    with holder.lock:
        handed = holder.pools.handed
        if len(handed) > 1024:  # backends of destroyed incarnations: drop the dead ones
            for key in [k for k, v in handed.items() if v[1].native is None]:
                del handed[key]
        handed[id(backend)] = (backend, record, device)
        if ORIGINALS not in cls.__dict__:
            with contextlib.suppress(TypeError, AttributeError):  # takes no new attributes
                _teach(cls)


def _owner(backend: Any) -> tuple[Record, Any] | None:
    entry = process.current().pools.handed.get(id(backend))
    if entry is None or entry[0] is not backend:
        return None
    return entry[1], entry[2]


def _originals(backend: Any) -> tuple[Any, Any]:
    """The class's own ``(register_mem_pool, deregister_mem_pool)``, for the lifecycle's calls."""
    for cls in type(backend).__mro__:
        found = cls.__dict__.get(ORIGINALS)
        if found is not None:
            return found
    raise LookupError(f"{type(backend).__name__} was never handed out by a reloadable group")


def _teach(cls: type) -> None:
    register = getattr(cls, REGISTER)
    deregister = getattr(cls, DEREGISTER, None)
    setattr(cls, ORIGINALS, (register, deregister))

    def register_mem_pool(self: Any, pool: Any, *args: Any, **kwargs: Any) -> Any:
        again = process.current().pools.replayed.get((id(self), id(pool)))
        if again is not None and again[0] is self and again[1] is pool:
            # Reload registered it again already; a framework's own hook doing the same
            # afterwards must not register it twice.
            return None
        result = register(self, pool, *args, **kwargs)
        owner = _owner(self)
        if owner is not None:
            record, device = owner
            record.replays.append((ENTRY, (device, pool, *args), kwargs))
        return result

    register_mem_pool.__doc__ = register.__doc__
    setattr(cls, REGISTER, register_mem_pool)
    if deregister is None:
        return

    def deregister_mem_pool(self: Any, pool: Any, *args: Any, **kwargs: Any) -> Any:
        result = deregister(self, pool, *args, **kwargs)
        process.current().pools.replayed.pop((id(self), id(pool)), None)
        owner = _owner(self)
        if owner is not None:
            replays = owner[0].replays
            replays[:] = [h for h in replays if not (h[0] == ENTRY and h[1][1] is pool)]
        return result

    deregister_mem_pool.__doc__ = deregister.__doc__
    setattr(cls, DEREGISTER, deregister_mem_pool)


def begin_reload() -> None:
    """Forget the previous reload's registrations (held until now so that ids stay unique)."""
    process.current().pools.replayed.clear()


def _kept(record: Record) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    return [entry for entry in record.replays if entry[0] == ENTRY]


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
            deregister = _originals(backend)[1]
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
        _originals(backend)[0](backend, pool, *rest, **kwargs)
    except Exception as error:
        logger.warning("could not register memory pool %r on %s again: %s", pool, label, error)
        return
    process.current().pools.replayed[(id(backend), id(pool))] = (backend, pool)
