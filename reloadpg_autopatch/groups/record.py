"""One recorded group creation and its life, as an explicit state machine.

A record stands for one ``new_group`` call that reload may have to replay (or for WORLD, when it
is registered). Its state says what this rank holds for it; ``TRANSITIONS`` lists every move
allowed, and ``Record.move`` refuses the others, so a lifecycle bug surfaces as an error at the
step that made it, not as a wrong group several cycles later. How the group sleeps and wakes is
its ``way`` (``groups/ways``), chosen once when it is created.
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Sequence
from typing import Any

from ..errors import TransitionError


class State(enum.Enum):
    """What this rank holds for a recorded group."""

    #: This rank is a member and a native group serves it.
    LIVE = "live"
    #: A member whose native group ``destroy_process_groups()`` freed; reload rebuilds it.
    DESTROYED = "destroyed"
    #: A member whose communicator sleeps in place (``suspend`` mode): the native group stays,
    #: its memory is released and every use is refused until reload resumes it.
    SUSPENDED = "suspended"
    #: A member whose communicator failed half-way through a suspend or a resume, or was
    #: aborted because a free of its step outlived its deadline: it cannot be used again in
    #: this process.
    BROKEN = "broken"
    #: This rank is not in the group. Reload replays the creation while a member needs it,
    #: because torch creates a group collectively (a communicator split, for instance).
    NON_MEMBER = "non-member"
    #: The program let go of it: ``destroy_process_group(g)``, or it dropped the last
    #: reference. Reload still takes part in its creation (and frees it at once) while a
    #: peer needs it.
    RELEASED = "released"
    #: Never used again: its world was destroyed, or every rank agreed nobody needs it.
    ENDED = "ended"


TRANSITIONS: dict[State, frozenset[State]] = {
    State.LIVE: frozenset(
        {State.DESTROYED, State.SUSPENDED, State.BROKEN, State.RELEASED, State.ENDED}
    ),
    State.DESTROYED: frozenset({State.LIVE, State.BROKEN, State.RELEASED, State.ENDED}),
    State.SUSPENDED: frozenset({State.LIVE, State.BROKEN, State.RELEASED, State.ENDED}),
    State.BROKEN: frozenset({State.RELEASED, State.ENDED}),
    State.NON_MEMBER: frozenset({State.ENDED}),
    State.RELEASED: frozenset({State.ENDED}),
    State.ENDED: frozenset(),
}


def _copy_arg(value: Any) -> Any:
    # The caller may reuse and mutate its ranks list after creating the group.
    return list(value) if isinstance(value, list) else value


class Record:
    """One ``new_group`` call: its arguments, its name, its state and its native group."""

    __slots__ = (
        "_ref",
        "alias",
        "args",
        "device",
        "ended_with_world",
        "kwargs",
        "name",
        "native",
        "published",
        "release_pending",
        "replays",
        "sleep",
        "state",
        "timeout",
        "way",
    )

    def __init__(
        self,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        name: str | None,
        state: State,
        way: Any = None,
    ) -> None:
        self.args = tuple(_copy_arg(a) for a in args)
        self.kwargs = {k: _copy_arg(v) for k, v in kwargs.items()}
        #: The name torch gave the first incarnation; every later one is created under it.
        self.name = name
        self.state = state
        self.native: Any = None
        self._ref: weakref.ref[Any] | None = None
        #: The key of the wrapper's aliases in torch's maps while a native group serves it.
        self.alias: Any = None
        self.ended_with_world = False
        #: How it sleeps and wakes (a ``ways.base.Way``): behind its wrapper, in place, by
        #: suspend, or WORLD's own.
        self.way = way
        #: The wrapper, held strongly once its name was handed out: torch's registry of names
        #: then resolves to it, and whoever cached the name holds the group as torch holds its
        #: own, until it is destroyed.
        self.published: Any = None
        #: The timeout the native group had when it was destroyed (``set_timeout`` included).
        self.timeout: Any = None
        #: What was registered on the group after creation (its own pre/post/abort hooks, the
        #: memory pools of its backend), made again on every new native group: ``(method
        #: name, args, kwargs)`` in registration order.
        self.replays: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        #: In place: the device the memory guard checks before the rebuild (None: none).
        self.device: Any = None
        #: While it sleeps in ``suspend`` mode: what was suspended, and how (``ways.suspend``).
        self.sleep: Any = None
        #: ``destroy_process_group(g)`` while it slept: released once the reload resumed it.
        self.release_pending = False

    def move(self, to: State) -> None:
        """Change state; a move ``TRANSITIONS`` does not list raises ``TransitionError``."""
        if to not in TRANSITIONS[self.state]:
            raise TransitionError(
                f"record of group {self.name!r} cannot go from {self.state.value} to {to.value}"
            )
        self.state = to
        if to in (State.RELEASED, State.ENDED):
            self.published = None  # gone for good: nothing of ours holds the wrapper any more

    def attach(self, wrapper: Any) -> None:
        self._ref = weakref.ref(wrapper)

    @property
    def wrapper(self) -> Any:
        return self._ref() if self._ref is not None else None

    @property
    def in_place(self) -> bool:
        """Whether reload reconfigures torch's own object (native mode)."""
        return self.way is not None and self.way.in_place

    @property
    def member(self) -> bool:
        return self._ref is not None or (self.way is not None and self.way.torch_object)

    @property
    def held(self) -> Any:
        """The group object the program holds: the wrapper, or torch's own group."""
        return self.way.held(self)

    def set_native(self, native: Any) -> None:
        """Point the record, and the program's wrapper if it still has one, at ``native``."""
        self.native = native
        wrapper = self.wrapper
        if wrapper is not None:
            wrapper.group = native

    def __repr__(self) -> str:
        return f"<Record {self.name!r} {self.state.value} {self.kwargs or self.args}>"
