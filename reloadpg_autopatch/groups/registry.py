"""The per-process record of every reloadable group creation, in creation order.

torch names a new group after a process-wide counter, and a group's rendezvous keys live under
that name. Reloading therefore has to replay ``new_group`` calls in one order on every rank,
including the calls where this rank is not a member (torch returns ``NON_GROUP_MEMBER`` but
still advances the counter). The registry keeps one ``Record`` per such call:

- a member record holds the native group and a *weak* reference to its wrapper, so a group the
  program dropped is not kept alive by us;
- a non-member record holds only the creation arguments;
- a member record whose wrapper is gone, or that was released with
  ``torch.distributed.destroy_process_group``, is a tombstone: reload still creates its group
  (the peers are waiting for it) and destroys it at once, so no communicator lingers.

The registry is keyed by pid: a forked child inherits the parent's memory, but never its groups.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger("reloadpg_autopatch")

#: Serialises registrations and lifecycle steps of this process.
_LOCK = threading.RLock()


def _reset_lock_in_child() -> None:
    # A fork taken while another thread held the lock would leave the child unable to take it.
    global _LOCK
    _LOCK = threading.RLock()


os.register_at_fork(after_in_child=_reset_lock_in_child)


def _copy_arg(value: Any) -> Any:
    # The caller may reuse and mutate its ranks list after creating the group.
    return list(value) if isinstance(value, list) else value


class Record:
    """One ``new_group`` call that reload must replay."""

    __slots__ = ("_ref", "args", "kwargs", "live", "member", "native", "released")

    def __init__(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        self.args = tuple(_copy_arg(a) for a in args)
        self.kwargs = {k: _copy_arg(v) for k, v in kwargs.items()}
        self.native: Any = None
        self.live = True
        self.released = False
        self.member = False
        self._ref: weakref.ref[Any] | None = None

    def attach(self, wrapper: Any) -> None:
        self.member = True
        self._ref = weakref.ref(wrapper)

    @property
    def wrapper(self) -> Any:
        return self._ref() if self._ref is not None else None

    @property
    def tombstone(self) -> bool:
        return self.member and (self.released or self.wrapper is None)

    def _set_native(self, native: Any) -> None:
        self.native = native
        wrapper = self.wrapper
        if wrapper is not None and not self.released:
            wrapper.group = native


class Registry:
    """Records of one process, in creation order."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    def add(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Record:
        record = Record(args, kwargs)
        with _LOCK:
            self.records.append(record)
        return record

    def record_of(self, native: Any) -> Record | None:
        """The record whose current native group is ``native``, if any."""
        for record in self.records:
            if record.native is native and record.member:
                return record
        return None

    def live_groups(self) -> list[Any]:
        """Wrappers still referenced by the program and not released."""
        out = []
        for record in self.records:
            wrapper = record.wrapper
            if wrapper is not None and not record.released:
                out.append(wrapper)
        return out

    def destroy(self, destroy_native: Callable[[Any], None]) -> int:
        """Destroy every native group we created, newest first. Returns how many."""
        count = 0
        with _LOCK:
            for record in reversed(self.records):
                if not record.live:
                    continue
                native = record.native
                if record.member and native is not None:
                    destroy_native(native)
                    count += 1
                record.live = False
                record._set_native(None)
        return count

    def reload(self, create: Callable[..., Any], destroy_native: Callable[[Any], None]) -> int:
        """Replay every destroyed record in creation order. Returns how many groups are live."""
        count = 0
        with _LOCK:
            for record in self.records:
                if record.live:
                    continue
                native = create(*record.args, **record.kwargs)
                if record.tombstone:
                    # Our peers create this group too; take part, then let it go.
                    destroy_native(native)
                    native = None
                elif record.member:
                    count += 1
                record.live = True
                record._set_native(native)
        return count

    def forget_natives(self) -> None:
        """Mark everything destroyed after torch tore down all groups (WORLD was destroyed)."""
        with _LOCK:
            for record in self.records:
                record.live = False
                record._set_native(None)

    def release(self, record: Record, destroy_native: Callable[[Any], None]) -> None:
        """Destroy one group for good: it becomes a tombstone that reload will not revive."""
        with _LOCK:
            if record.live and record.native is not None:
                destroy_native(record.native)
            record._set_native(None)
            record.released = True


_REGISTRIES: dict[int, Registry] = {}


def current() -> Registry:
    """This process's registry (a forked child starts with an empty one)."""
    pid = os.getpid()
    registry = _REGISTRIES.get(pid)
    if registry is None:
        with _LOCK:
            registry = _REGISTRIES.setdefault(pid, Registry())
    return registry


def lock() -> threading.RLock:
    """The lock every lifecycle step of this process holds."""
    return _LOCK
