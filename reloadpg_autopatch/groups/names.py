"""Group names and rendezvous keys: the one owner of both.

torch names a group once, when it is created, and everything that caches a group by name
(DeviceMesh, functional collectives, compiled graphs, ``_resolve_process_group``) keeps that
name. So a reload creates every native group under the name its first incarnation got, on every
rank. The rendezvous keys, though, must be new each time: a rank that reaches reload seconds
after its peers must never read the addresses they published in an earlier generation. torch
derives both from one value (the store prefix is the group name), so during a replay the name
is forced to the recorded one and the default store is swapped for one under a key prefix that
no other generation uses. Both substitutions are undone as soon as the creation returns.

torch also resets its group counter when WORLD is destroyed, which is how a swap of WORLD would
hand later groups the names of live ones: ``preserved_group_count`` keeps it monotonic.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Collection, Iterator
from typing import Any

from torch.distributed import distributed_c10d as c10d

#: torch's type for group names (a ``NewType`` of ``str``).
_GROUP_NAME = getattr(c10d, "GroupName", str)


class Observed:
    """The names torch computed during an ``observing()`` block, in order."""

    def __init__(self) -> None:
        self.names: list[str] = []

    @property
    def last(self) -> str | None:
        return self.names[-1] if self.names else None


@contextlib.contextmanager
def _namer(replacement: Any) -> Iterator[None]:
    previous = c10d._process_group_name
    c10d._process_group_name = replacement
    try:
        yield
    finally:
        c10d._process_group_name = previous


@contextlib.contextmanager
def observing(taken: Callable[[], Collection[str]] = frozenset) -> Iterator[Observed]:
    """Record the name torch gives each group created in the block (members or not).

    A hashed name (``use_local_synchronization=True``) that is already ``taken()`` by a group
    this process still records is salted until it is not. torch 2.13 hashes the ranks with
    ``len(_world.pg_names)``, which shrinks while groups are destroyed (and WORLD swapped), so
    it can hand out the name of a destroyed group with the same ranks; reload would then create
    both under one name. Every member of the new group holds the records of every earlier group
    of the same ranks, so every member salts alike.
    """
    observed = Observed()
    inner = c10d._process_group_name

    def recording(ranks: Any, use_hashed_name: Any) -> Any:
        name = inner(ranks, use_hashed_name)
        if use_hashed_name:
            name = _unused(name, taken())
        observed.names.append(str(name))
        return name

    with _namer(recording):
        yield observed


def _unused(name: Any, taken: Collection[str]) -> Any:
    salt = 0
    candidate = name
    while str(candidate) in taken:
        salt += 1
        digest = hashlib.sha1(f"{name}/{salt}".encode(), usedforsecurity=False).hexdigest()
        candidate = _GROUP_NAME(digest)
    return candidate


@contextlib.contextmanager
def forcing(name: str) -> Iterator[None]:
    """The next group torch names in the block gets ``name`` (the group counter stays put)."""
    pending = [name]
    inner = c10d._process_group_name

    def forced(*args: Any, **kwargs: Any) -> Any:
        if pending:
            return _GROUP_NAME(pending.pop())
        return inner(*args, **kwargs)

    with _namer(forced):
        yield


@contextlib.contextmanager
def keys_under(store: Any) -> Iterator[None]:
    """Groups created in the block rendezvous through ``store`` instead of the default store
    (a ``written.Recording`` under a prefix of this cycle)."""
    world = c10d._world
    default = world.default_pg
    if default is None:
        raise RuntimeError("no default group: torch.distributed is not initialized")
    backend, held = world.pg_map[default]
    swapped = (backend, store)
    world.pg_map[default] = swapped
    try:
        yield
    finally:
        if world.pg_map.get(default) is swapped:  # not torn down (a new world) in the block
            world.pg_map[default] = (backend, held)


@contextlib.contextmanager
def preserved_group_count() -> Iterator[None]:
    """Keep torch's group counter from going back (destroying WORLD resets it to 0)."""
    world = c10d._world
    saved = world.group_count
    try:
        yield
    finally:
        world.group_count = max(saved, world.group_count)


def publish(name: str, group: Any) -> None:
    """Make ``name`` resolve to ``group`` in torch's registry of group names.

    torch registers the native group; a reloadable group whose name was handed out is
    registered instead, so that whatever resolves the name later (DeviceMesh, FSDP2 holding the
    result, functional collectives, compiled graphs) gets the object that outlives reloads.
    """
    c10d._unregister_process_group(name)
    c10d._register_process_group(name, group)


def withdraw(name: str) -> None:
    """Make ``name`` resolve to nothing again (torch registers a group's name as it creates it)."""
    c10d._unregister_process_group(name)
