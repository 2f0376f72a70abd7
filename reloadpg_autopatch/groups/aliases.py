"""Aliases in torch's ``_world`` maps: a reloadable group is found where its native group is.

c10d keeps a group's ranks, name, backend, store and tag in ``_world`` maps keyed by the native
object, and looks groups up there: its own functions, every module that bound them at import
(DeviceMesh binds ``get_process_group_ranks`` before any patch can land), and code that reads
the maps directly (Megatron's ``destroy_model_parallel`` tests ``_world.pg_map.get(group)``).
So while a reloadable group has a native group, each map also holds an alias entry for it: the
same value, under a key that hashes like the wrapper and compares equal to it.

An alias must not change what torch sees, and must not cost torch anything:
- lookups by a native group never meet an alias (other hash), so they stay C dict lookups;
- the maps are dicts that leave aliases out of ``len`` and iteration, so torch's teardown loop
  shuts each group down once and its name hashing (which counts ``pg_names``) is unchanged;
- an alias holds its wrapper weakly, so a group the program drops can still be collected.

torch 2.15 adds ``_world.pg_flight_recorder_hooks``: each group's flight-recorder handle, which
detaches the recorder when dropped and holds its group alive while kept. It is an attribute of
the ``_world`` object (not a module-level map), and it gets aliases like the others: a
reloadable group answers for its native group's handle, ``unlink`` takes the alias away before
the native group goes (an alias left behind would keep the handle, and so the old group,
alive), and torch's own destroy pops or clears the rest, as it does for every other map. The
names registry (``names``) is torch's C++ one and holds no handle.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

_Native = dist.ProcessGroup

#: The module-level maps behind ``_world``'s properties (``_world.pg_map`` is ``_pg_map``...).
MAPS = ("_pg_map", "_pg_names", "_pg_group_ranks", "_pg_backend_config", "_pg_to_tag")


class AliasKey:
    """Stands for a reloadable group in a map: its hash, equal to it, holding it weakly."""

    __slots__ = ("_hash", "_ref")

    def __init__(self, wrapper: Any) -> None:
        self._ref = weakref.ref(wrapper)
        self._hash = hash(wrapper)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if type(other) is AliasKey:
            return other is self or (self._ref() is not None and self._ref() is other._ref())
        return other is not None and self._ref() is other

    def __repr__(self) -> str:
        return f"<alias of {self._ref()!r}>"


class AliasingMap(dict):
    """One of torch's ``_world`` maps: its entries, and aliases that ``len`` and loops skip."""

    __slots__ = ("hidden",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.hidden = 0

    def _visible(self) -> Iterator[Any]:
        return (k for k in dict.__iter__(self) if type(k) is not AliasKey)

    def __iter__(self) -> Iterator[Any]:
        return self._visible()

    def __len__(self) -> int:
        return dict.__len__(self) - self.hidden

    def keys(self) -> list[Any]:  # type: ignore[override]
        return list(self._visible())

    def values(self) -> list[Any]:  # type: ignore[override]
        return [v for k, v in dict.items(self) if type(k) is not AliasKey]

    def items(self) -> list[tuple[Any, Any]]:  # type: ignore[override]
        return [(k, v) for k, v in dict.items(self) if type(k) is not AliasKey]

    def copy(self) -> dict[Any, Any]:
        return dict(self.items())

    def __repr__(self) -> str:
        return repr(dict(self.items()))

    def clear(self) -> None:
        dict.clear(self)
        self.hidden = 0

    def __delitem__(self, key: Any) -> None:
        dict.__delitem__(self, key)
        if _names_an_alias(key):
            self.hidden -= 1

    def pop(self, key: Any, *default: Any) -> Any:
        if _names_an_alias(key) and dict.__contains__(self, key):
            self.hidden -= 1
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple[Any, Any]:
        for key in reversed(list(self._visible())):
            return key, self.pop(key)
        raise KeyError("popitem(): dictionary is empty")


def _names_an_alias(key: Any) -> bool:
    """Whether ``key`` can only match an alias: natives are never aliased, wrappers always."""
    return type(key) is AliasKey or (type(key) is not _Native and isinstance(key, _Native))


#: torch 2.15's map of flight-recorder handles, read through this property of ``_world``.
RECORDER_MAP = "pg_flight_recorder_hooks"


def _recorder_attribute() -> str | None:
    """The attribute of ``_world`` behind ``_world.pg_flight_recorder_hooks`` (torch 2.15;
    None before 2.15, or where the property hands out anything but that attribute)."""
    world = c10d._world
    try:
        current = getattr(world, RECORDER_MAP, None)
    except Exception:  # a property of a torch we do not know: leave it alone
        return None
    if not isinstance(current, dict):
        return None
    return next((name for name, value in vars(world).items() if value is current), None)


def _present() -> list[Any]:
    """torch's maps that exist here: the module-level ones, and the recorder map."""
    found = [getattr(c10d, name) for name in MAPS if hasattr(c10d, name)]
    recorder = _recorder_attribute()
    if recorder is not None:
        found.append(getattr(c10d._world, recorder))
    return found


def _maps() -> list[AliasingMap]:
    return [value for value in _present() if type(value) is AliasingMap]


def install() -> bool:
    """Put aliasing maps behind ``_world`` (idempotent). Returns whether they are in place."""
    if type(c10d._world) is not c10d._World:
        return False  # a test harness swapped _world (threaded process groups): leave it
    for name in MAPS:
        current = getattr(c10d, name, None)
        if isinstance(current, dict) and type(current) is not AliasingMap:
            setattr(c10d, name, AliasingMap(current))
    recorder = _recorder_attribute()
    if recorder is not None:
        current = getattr(c10d._world, recorder)
        if type(current) is not AliasingMap:
            setattr(c10d._world, recorder, AliasingMap(current))
    return installed()


def installed() -> bool:
    """Whether every map behind ``_world`` can hold aliases (the doctor asks)."""
    present = _present()
    return bool(present) and all(type(value) is AliasingMap for value in present)


def link(wrapper: Any, native: Any) -> AliasKey | None:
    """Add ``wrapper``'s aliases of ``native``'s entries; returns the key to unlink them with."""
    if not install():
        return None
    key = AliasKey(wrapper)
    for mapping in _maps():
        if dict.__contains__(mapping, native) and not dict.__contains__(mapping, key):
            dict.__setitem__(mapping, key, dict.__getitem__(mapping, native))
            mapping.hidden += 1
    return key


def unlink(key: AliasKey | None) -> None:
    """Remove the aliases added under ``key`` (before its native group goes)."""
    if key is None:
        return
    for mapping in _maps():
        if dict.__contains__(mapping, key):
            dict.__delitem__(mapping, key)
            mapping.hidden -= 1


def count() -> int:
    """Alias entries in the maps now (the doctor and the benchmarks report it)."""
    return sum(mapping.hidden for mapping in _maps())
