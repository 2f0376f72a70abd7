"""Let torch's own per-group maps answer for a reloadable group as for its native group.

c10d keeps a group's ranks, name, backend, store and tag in ``_world`` maps keyed by the native
object, and looks groups up there: its own functions, every module that bound them at import
(DeviceMesh binds ``get_process_group_ranks`` before any patch can land), and code that reads
the maps directly (Megatron's ``destroy_model_parallel`` tests ``_world.pg_map.get(group)``).
The maps are replaced by dicts that, on a miss, look the key up again as the native group inside
it. Nothing is stored twice: iteration, ``len`` and every native lookup are exactly torch's, so
torch's name hashing (which counts ``pg_names``) and its teardown loops see what they always saw.
Lookups by a native group cost what they cost before (``[]`` hits never leave C); ``in`` and
``get`` pay one Python call.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from .reloadable import ReloadableProcessGroup

_Native = dist.ProcessGroup
_MISSING = object()

#: The module-level maps behind ``_world``'s properties (``_world.pg_map`` is ``_pg_map``...).
MAPS = ("_pg_map", "_pg_names", "_pg_group_ranks", "_pg_backend_config", "_pg_to_tag")


def _native_of(key: Any) -> Any:
    """The live native group behind a wrapper key, or None for anything else."""
    cls = type(key)
    if cls is _Native or cls is int or key is None:
        return None
    for _ in range(16):
        if not isinstance(key, _Native) or type(key) is _Native:
            break
        inner = key.group if type(key) is ReloadableProcessGroup else getattr(key, "group", None)
        if inner is None or inner is key:
            return None
        key = inner
    return key if type(key) is _Native else None


class AliasingMap(dict):
    """A dict keyed by native groups that also answers for the wrappers around them."""

    __slots__ = ()

    def __missing__(self, key: Any) -> Any:
        native = _native_of(key)
        if native is None:
            raise KeyError(key)
        return dict.__getitem__(self, native)

    def __contains__(self, key: object) -> bool:
        if dict.__contains__(self, key):
            return True
        native = _native_of(key)
        return native is not None and dict.__contains__(self, native)

    def get(self, key: Any, default: Any = None) -> Any:
        value = dict.get(self, key, _MISSING)
        if value is not _MISSING:
            return value
        native = _native_of(key)
        return default if native is None else dict.get(self, native, default)

    def pop(self, key: Any, *default: Any) -> Any:
        if not dict.__contains__(self, key):
            native = _native_of(key)
            if native is not None:
                key = native
        return dict.pop(self, key, *default)

    def __delitem__(self, key: Any) -> None:
        if not dict.__contains__(self, key):
            native = _native_of(key)
            if native is not None:
                key = native
        dict.__delitem__(self, key)


def install() -> bool:
    """Put aliasing maps behind ``_world`` (idempotent). Returns whether they are in place."""
    if type(c10d._world) is not c10d._World:
        return False  # a test harness swapped _world (threaded process groups): leave it
    for name in MAPS:
        current = getattr(c10d, name, None)
        if current is None or type(current) is AliasingMap:
            continue
        setattr(c10d, name, AliasingMap(current))
    return installed()


def installed() -> bool:
    """Whether every map behind ``_world`` answers for wrappers (the doctor asks)."""
    present = [getattr(c10d, name) for name in MAPS if hasattr(c10d, name)]
    return all(type(value) is AliasingMap for value in present)
