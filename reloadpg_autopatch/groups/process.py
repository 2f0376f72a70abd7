"""The one holder of this process's lifecycle state, in parts, each written by one module.

Everything the lifecycle knows about this process lives in one ``ProcessState``, split by who
writes it, so a reader knows where each value changes:

- the cycle and its phase (``phase``, ``cycle``, ``attempt``, the step running, the last
  report, why a world was lost): the holder's own fields, written by ``stepping``;
- ``world``: WORLD's registration, the parent's WORLD in a forked child, the lazy-gloo switch:
  written by the ``world`` package;
- ``records``: every recorded creation in creation order, the index that finds them, and the
  default group they belong to: written by ``registry``;
- ``rounds``: the token and the result key of the last world-wide store round: written by
  ``store.channel``;
- ``pools``: the backends a reloadable group handed out and the pools registered again:
  written by ``pools``;
- ``ways``: what each way keeps for this process, in a slot of its own: written by the ways
  (and emptied by the ``world`` package when a world ends).

``PHASES`` lists every phase change allowed and ``ProcessState.move`` refuses the others, as
``Record.move`` does for a record. A forked child inherits the parent's memory but never its
groups (their communicators belong to the parent), so ``_reset_in_child`` gives it a fresh
holder with a fresh lock: that one function is the whole fork reset (the program's choices, in
``settings``, survive it). The parent's holder is kept alive in the child, never used and never
freed: dropping it would run torch destructors (gloo joins threads that exist only in the
parent) on communicators that belong to the parent, and crash the child.

Store keys come from what every rank of a world agrees on (the cycle number, counted from 1 in
each world, and the step), never from what this process did before it joined the world: a
restarted rank and a survivor of an earlier world derive the same keys.
"""

from __future__ import annotations

import enum
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import TransitionError

if TYPE_CHECKING:
    from .record import Record
    from .report import CycleReport


class Phase(enum.Enum):
    """Where this process is in the destroy/reload cycle."""

    #: Groups have their communicators (or sleep only because they were made asleep).
    AWAKE = "awake"
    #: ``destroy_process_groups()`` is running.
    DESTROYING = "destroying"
    #: Between ``destroy_process_groups()`` and ``reload_process_groups()``.
    ASLEEP = "asleep"
    #: ``reload_process_groups()`` is running.
    RELOADING = "reloading"


#: Every phase change allowed. A failed destroy goes back to awake only when it freed nothing;
#: a failed reload stays asleep (it can be called again); a destroy while asleep frees the
#: groups made since.
PHASES: dict[Phase, frozenset[Phase]] = {
    Phase.AWAKE: frozenset({Phase.DESTROYING}),
    Phase.DESTROYING: frozenset({Phase.ASLEEP, Phase.AWAKE}),
    Phase.ASLEEP: frozenset({Phase.DESTROYING, Phase.RELOADING}),
    Phase.RELOADING: frozenset({Phase.AWAKE, Phase.ASLEEP}),
}


class TorchDefault:
    """Where an unregistered world's steps take their store, timeout and ranks: torch's default
    group, now (a registration keeps them across WORLD's swap instead)."""

    @property
    def store(self) -> Any:
        from torch.distributed import distributed_c10d as c10d

        return c10d._get_default_store()

    @property
    def timeout(self) -> Any:
        from torch.distributed import distributed_c10d as c10d

        from .backends import timeout_or_default

        return timeout_or_default(c10d._get_default_group(), str(c10d.get_backend()))

    @property
    def rank(self) -> int:
        import torch.distributed as dist

        return dist.get_rank()

    @property
    def world_size(self) -> int:
        import torch.distributed as dist

        return dist.get_world_size()


@dataclass
class World:
    """WORLD as this process knows it; written by the ``world`` package."""

    #: WORLD's registration (``world.registration.Registration``), if any.
    registration: Any = None
    #: What every step reads its store, timeout and ranks from: the registration, else torch.
    facts: Any = field(default_factory=TorchDefault)
    #: In a forked child: the parent's WORLD, which this process must never take part in.
    #: While it is still the default group, destroy and reload have nothing to do here.
    parents: Any = None
    #: ``TORCH_GLOO_LAZY_INIT`` while a lazy creation runs: depth and the saved value.
    lazy_depth: int = 0
    lazy_saved: str | None = None
    #: Names of the groups ``new_group`` handed out as torch's own in this world: a cycle leaves
    #: them alone as it leaves groups made outside ``new_group`` (``world.carry``).
    left_native: set[str] = field(default_factory=set)
    #: The settings that decide a refusal were compared across ranks in this world, and the
    #: error every rank raised if they differ (``world.settings_round``).
    settings_agreed: bool = False
    settings_error: Any = None


@dataclass
class Records:
    """Every recorded creation still of use, in creation order; written by ``registry``."""

    all: list[Record] = field(default_factory=list)
    #: The default group the records belong to; another one means a new world.
    world: Any = None
    #: ``id(native) -> record``, and the ``changes`` it was built at.
    index: dict[int, Record] = field(default_factory=dict)
    index_at: int = -1
    #: Bumped whenever a record is added or pruned.
    changes: int = 0


@dataclass
class Rounds:
    """The world-wide store rounds; written by ``store.channel``."""

    #: The fresh token of this step's store round, the same on every rank: what torch creates
    #: in the step (groups, a WORLD) rendezvous under it, so no key an earlier world left in
    #: the same store is ever read.
    token: str = ""
    #: The store, result key and world size of the last world-wide store round.
    last: tuple[Any, str, int] | None = None
    #: ``(store, key)``: what torch wrote in this rank's creations (``written``), deleted by
    #: this rank after the next cycle's first round.
    written: list[tuple[Any, str]] = field(default_factory=list)
    #: Markers of keys torch wrote that this rank cannot name (``store.channel.mark``), deleted
    #: then too, after one listing.
    marked: list[str] = field(default_factory=list)
    #: WORLD's store and the view of it the rounds use (``store.channel.base_store``).
    through: tuple[Any, Any] | None = None
    #: A step failed on this rank: its next round waits for peers still leaving that step.
    after_failure: bool = False


@dataclass
class Pools:
    """Memory pools; written by ``pools``.

    ``handed``: ``id(backend) -> (backend, record, device)`` for the backends a reloadable
    group handed out; ``replayed``: ``(id(backend), id(pool)) -> (backend, pool)`` registered
    again by the reload running now.
    """

    handed: dict[int, tuple[Any, Record, Any]] = field(default_factory=dict)
    replayed: dict[tuple[int, int], tuple[Any, Any]] = field(default_factory=dict)


class ProcessState:
    """This process's groups, its place in the cycle, and what the cycle keeps per process."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        # ---- the cycle and its phase: written by ``stepping`` ----
        self.phase = Phase.AWAKE
        #: Cycles begun in this world: the one running or the last one (0: none yet).
        self.cycle = 0
        #: Reload attempts begun in this cycle (a refused reload can be called again).
        self.attempt = 0
        #: The step running now in this process, and the thread running it.
        self.step: str | None = None
        self.step_thread: int | None = None
        #: The report of the latest cycle (``last_cycle_report``).
        self.last_report: CycleReport | None = None
        #: Why the last world was lost half-way through a step, for the next step's error.
        self.lost: str | None = None
        #: Worlds this process has ended, for the cycle report's ``world`` (never for keys).
        self.worlds_ended = 0
        # ---- the other parts, each with its own writer ----
        self.world = World()
        self.records = Records()
        self.rounds = Rounds()
        self.pools = Pools()
        #: What each way keeps for this process, in a slot of its own (the suspend way: the
        #: groups this rank left awake, ``ways.suspend.awake``); a new world starts without.
        self.ways: dict[str, Any] = {}

    def move(self, to: Phase) -> None:
        """Change phase; a change ``PHASES`` does not list raises ``TransitionError``."""
        if to not in PHASES[self.phase]:
            raise TransitionError(
                f"this process cannot go from {self.phase.value} to {to.value} (a bug of "
                "reloadpg_autopatch: please report it with the log)"
            )
        self.phase = to

    @property
    def asleep(self) -> bool:
        """Whether the groups sleep: between a destroy and the reload that ends the cycle."""
        return self.phase is not Phase.AWAKE

    @property
    def in_parents_world(self) -> bool:
        """Whether this is a forked child still inside its parent's WORLD (it holds no group)."""
        parents = self.world.parents
        if parents is None:
            return False
        from torch.distributed import distributed_c10d as c10d

        return c10d._world.default_pg is parents

    def key(self, step: str, *parts: object) -> str:
        """A store key of this cycle's ``step`` that no other cycle or step of the world uses.

        ``reloadpg_autopatch/<cycle>/<n>/...``: ``n`` is 0 for the destroy and the attempt
        for a reload. Every rank derives it from what the world agrees on (the cycle, the
        step), so ranks agree on it whatever their processes did before: a restarted rank
        and a survivor of an earlier world meet under the same keys.
        """
        n = 0 if step == "destroy" else self.attempt
        tail = "/".join(str(p) for p in parts)
        return f"reloadpg_autopatch/{self.cycle}/{n}/{tail}"


_STATE: ProcessState | None = None
_CREATE = threading.Lock()


def current() -> ProcessState:
    """This process's state, created on first use."""
    global _STATE
    state = _STATE
    if state is None:
        with _CREATE:
            if _STATE is None:
                _STATE = ProcessState()
            state = _STATE
    return state


#: The holders this process inherited through fork: referenced for ever, never used.
_INHERITED: list[ProcessState] = []


def _reset_in_child() -> None:
    """The whole fork reset: a fresh holder (and lock) that knows it is in its parent's world."""
    global _STATE, _CREATE
    inherited = _STATE
    _CREATE = threading.Lock()
    if inherited is not None:
        _INHERITED.append(inherited)  # never freed here: see the module's docstring
    fresh = ProcessState()
    # The parent's WORLD is the default group now: the grandparent's, while the parent is still
    # in it, or the parent's own world once it started one (never the grandparent's then).
    fresh.world.parents = _default_group()
    _STATE = fresh


def _default_group() -> Any:
    """The default group now, without importing torch into a process that has not."""
    import sys

    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    return getattr(getattr(c10d, "_world", None), "default_pg", None)


os.register_at_fork(after_in_child=_reset_in_child)
