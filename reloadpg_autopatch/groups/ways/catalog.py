"""The ways a group sleeps and wakes, and the one place that chooses a group's way.

A way is one module behind one interface (``base.Way``): behind a wrapper (``wrapper``), in
place (``inplace``), by suspend (``suspend``); WORLD's own ways live in ``groups/world``. Each
reload mode lists the ways it may choose, in order of preference (``MODES``); ``choose`` asks
each whether it can take a group and returns the first that can, or, in a mode that allows one
way only, refuses loudly. The lifecycle (a new group's way), the patch installer (whether any
group will need a wrapper: ``lifecycle_only``) and the doctor (``explain``) all ask here.

A new way is one module and one call: ``register(way, mode="name")`` makes a mode of that name
that chooses it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..._env import MODES as _MODE_NAMES
from .. import mode as modes
from .base import Way, missing_steps
from .inplace import IN_PLACE, InPlace
from .suspend import SUSPEND, SUSPEND_WRAPPED, Suspend, SuspendWrapped, torch_has_pre_hooks
from .suspend import awake as suspend_awake
from .wrapper import WRAPPER, Wrapper

__all__ = [
    "IN_PLACE",
    "MODES",
    "SUSPEND",
    "SUSPEND_WRAPPED",
    "WRAPPER",
    "Builtin",
    "InPlace",
    "Suspend",
    "SuspendWrapped",
    "Way",
    "Wrapper",
    "candidates_for",
    "choose",
    "explain",
    "lifecycle_only",
    "missing_steps",
    "register",
    "registered",
]


def _suspend() -> Way:
    """Suspend guards torch's own group with a pre-hook (torch 2.14); else its wrapper."""
    return SUSPEND if torch_has_pre_hooks() else SUSPEND_WRAPPED


def _fixed(way: Way) -> Callable[[], Way]:
    return lambda: way


#: Each mode's ways, most preferred first (a callable, where torch decides which one).
MODES: dict[str, tuple[Callable[[], Way], ...]] = {
    "wrapper": (_fixed(WRAPPER),),
    "native": (_fixed(IN_PLACE),),
    "suspend": (_suspend,),
    "auto": (_suspend, _fixed(IN_PLACE), _fixed(WRAPPER)),
}
assert set(MODES) == set(_MODE_NAMES)

_REGISTERED: list[Way] = []


class _Ways(type):
    def __iter__(cls) -> Any:
        return iter((cls.WRAPPER, cls.IN_PLACE, cls.SUSPEND, cls.SUSPEND_WRAPPED))

    def __len__(cls) -> int:
        return 4


class Builtin(metaclass=_Ways):
    """The built-in ways a group can take, by name (iterable, for tables over every way)."""

    WRAPPER = WRAPPER
    IN_PLACE = IN_PLACE
    SUSPEND = SUSPEND
    SUSPEND_WRAPPED = SUSPEND_WRAPPED


def declined(native: Any) -> bool:
    """Whether a group the wrap policy left torch's own stays so, awake: the way that may take
    such a group (suspend) cannot take it on this rank (then it names it to its peers)."""
    return suspend_awake.decline(native)


def left_alone(native: Any) -> Any:
    """A new group no way takes here (``choose`` said None): torch's own and awake, named to
    its peers at every destroy, in case one of them would have it sleep."""
    return suspend_awake.leave_awake(native)


def register(way: Way, *, mode: str | None = None) -> Way:
    """Make ``way`` known; with ``mode``, a reload mode of that name that chooses it alone.

    Refused (``TypeError``) when its decisions can give a step it has no method for: that step
    would otherwise fail half-way through a cycle, after the ranks agreed on it; and
    (``ValueError``) when ``mode`` names a built-in mode, whose ways are fixed.
    """
    if mode is not None and mode.strip().lower() in _MODE_NAMES:
        raise ValueError(
            f"mode {mode!r} is a built-in mode ({', '.join(_MODE_NAMES)}); register your way "
            "under a name of its own"
        )
    missing = missing_steps(way)
    if missing:
        raise TypeError(
            f"way {way.name!r} ({type(way).__name__}) can give steps it has no method to carry "
            f"out: {', '.join(missing)}; define them on {type(way).__name__} "
            "(ways.base.steps lists the method of each step)"
        )
    if way not in _REGISTERED:
        _REGISTERED.append(way)
    if mode is not None:
        MODES[mode] = (_fixed(way),)
        modes.add(mode)
    return way


for _builtin in (WRAPPER, IN_PLACE, SUSPEND, SUSPEND_WRAPPED):
    register(_builtin)


def registered() -> list[Way]:
    """Every way known in this process (WORLD's included, once registered)."""
    return list(_REGISTERED)


def _name(group: Any) -> str:
    return str(getattr(group, "group_name", "?"))


def _size(group: Any) -> int:
    try:
        return int(group.size())
    except Exception:  # torch cannot say: not a one-rank group as far as anyone knows
        return 0


def candidates_for(group: Any) -> list[Way]:
    """The ways the mode in force may choose for ``group``, most preferred first.

    Where the mode may choose among several, a one-rank group never suspends: a one-rank
    NCCL communicator's network buffer (512 MiB, NCCL #2363) stays resident while suspended,
    and with no peer to agree with, freeing it and making it again at the reload gives back
    everything for little.
    """
    candidates = [get() for get in MODES[modes.get_reload_mode()]]
    if len(candidates) > 1 and _size(group) == 1:
        return [way for way in candidates if not way.suspends] or candidates
    return candidates


def choose(group: Any, *, refuse: Callable[[Way], str | None] | None = None) -> Way | None:
    """The way of a new member's group, per the mode in force; None: left alone, awake.

    ``refuse``: why the world around the group refuses a way (a WORLD swapped at every destroy
    leaves only ``makes_anew`` ways: ``world.facts.choose_group_way``). A mode with one way
    refuses a group that way cannot take (``ModeRefusedError``, naming why), except a group
    that way leaves awake.
    """
    candidates = candidates_for(group)
    for way in candidates:
        refusal = way.refusal(group) or (refuse(way) if refuse is not None else None)
        if refusal is None:
            return way
        if len(candidates) == 1:
            if way.stays_awake(group):
                return None
            raise way.strict_error(_name(group), refusal)
    return WRAPPER


def explain(group: Any, backend: str) -> tuple[str, str | None]:
    """What the mode in force does with ``group`` and why, and the problem if it refuses it
    (the doctor's words, from the same answers ``choose`` decides with)."""
    chosen = modes.get_reload_mode()
    if chosen == "wrapper":
        return "behind a wrapper (the mode is wrapper)", None
    candidates = candidates_for(group)
    refused: list[tuple[Way, str]] = []
    for way in candidates:
        refusal = way.refusal(group)
        if refusal is None:
            text = way.explain()
            for other, why in reversed(refused):
                text += other.cannot(why)
            return text, None
        refused.append((way, refusal))
    way, refusal = refused[0]
    if len(candidates) == 1 and way.stays_awake(group):
        return "stays awake, untouched: a CPU backend holds no accelerator memory", None
    return f"REFUSED: {refusal}", way.problem(backend, refusal)


def lifecycle_only() -> bool:
    """Whether no group will need a wrapper: every way the mode may choose holds torch's own
    object and this torch can do it (native mode on 2.14, suspend mode with pre-hooks)."""
    candidates = [get() for get in MODES[modes.get_reload_mode()]]
    return all(way.torch_object and way.available() for way in candidates)
