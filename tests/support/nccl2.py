"""Stand-ins for torch 2.15's ``nccl`` (nccl2): each new behaviour, modelled on gloo.

torch 2.15 cannot be installed where the suite runs, and NCCL needs a GPU, so each behaviour
of 2.15 that the package must meet is modelled here from torch's source (the facts and their
sources: ``docs/suspend-facts.md``, "torch 2.15"). The backends extend the package's CPU model
of NCCL's suspend, ``reloadpg_autopatch.tools.cpu_nccl`` (variant A, a ``ProcessGroupGloo``
subclass, both lanes): its suspend protocol, its call log (``cpu_nccl.CALLS``) and its pretend
device; each is registered under its own name (``name=``) and returned through
``cpu_nccl.track``, so that the model's ledger counts it.

They stay with the tests, out of the wheel: no user program needs them, and the models of
torch 2.15 below (the pre-hook order, the flight recorder's map) replace torch's own functions.

- :class:`SplittingGloo` (``"nccl2_split"``): a group is made from its parent's communicator
  at creation, as nccl2 makes every group by ``ncclCommSplit`` of WORLD's (PR #192895). The
  creator asks WORLD's backend to split: WORLD's log gets a ``split`` call in the state WORLD
  is in, and a split of a suspended communicator fails as NCCL would (the sticky fault of the
  suspendable stand-in). ``shrink`` (``ncclCommShrink`` over the parent) is logged the same
  way. Members only: torch calls no creator on a non-member.
- :class:`LazyGloo` (``"nccl2_lazy"``): ``options.lazy_init`` is true (2.15's nccl2 option),
  ``is_initialized()`` answers, and ``memory_stats()`` before the first collective would
  create the communicator (a collective bootstrap: one rank asking alone would block). The
  stand-in logs such a call as ``would block`` and raises at once, so that a wrong call shows
  in the log instead of hanging the suite. Its collectives run in C++ gloo and never reach
  Python, so a test says when the first one happened (``initialize()``).
- :class:`NonblockingGloo` (``"nccl2_nonblocking"``, registered for the pretend accelerator as
  torch registers NCCL, used as a group's accelerator leg: :func:`nonblocking_backend`): its
  communicator comes from
  ``reconfigure()`` (``options.enable_reconfigure``), which nccl2 makes nonblocking
  (PR #192275) while ``options.config.blocking`` stays unset; its ``suspend()`` raises NCCL's
  "in progress" (``NCCL_CHECK`` throws on ``ncclInProgress``) before anything is done.
- :class:`ClassicNccl` / :class:`Nccl2` (``"standin_classic"`` / ``"standin_nccl2"``): what
  the doctor reads of an implementation (``type(backend).__name__``, ``backend.name()``),
  registered under names that say nothing of NCCL.
- :class:`OrderedPreHooks`: torch 2.15 fires pre-hooks in id order (``std::map``); 2.14.1
  keeps them in an ``unordered_map`` (unspecified order). Installed, every
  ``ProcessGroup.register_pre_hook`` goes into a Python table per group, and one real torch
  pre-hook fires the table in ascending id order: 2.15's dispatch, on 2.14.
- :class:`FlightRecorder`: a hook that logs each collective as issued (pre-hook) and retires it
  (post-hook), as torch's ``FlightRecorderHook`` does; an entry never retired is a phantom.
- :class:`FlightRecorderMap`: 2.15's ``_world.pg_flight_recorder_hooks`` on 2.13/2.14: the
  property, a handle attached to every group whose backend does not record itself, popped when
  torch forgets the group and cleared with WORLD, as 2.15's ``distributed_c10d`` does.
"""

from __future__ import annotations

import functools
import gc
import threading
import types
import weakref
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from reloadpg_autopatch.tools import cpu_nccl as s

SPLIT = "nccl2_split"
LAZY = "nccl2_lazy"
NONBLOCKING = "nccl2_nonblocking"
CLASSIC = "standin_classic"
NCCL2 = "standin_nccl2"

#: torch's flight recorder's first hook id ('FREC', ``FlightRecorderHook.cpp``, 2.15).
RECORDER_ID = 0x46524543
#: NCCL's config value for "not set" (``NCCL_CONFIG_UNDEF_INT``).
UNDEF_INT = -2147483648
#: What nccl2's suspend of a nonblocking communicator raises (NCCL_CHECK on ncclInProgress).
IN_PROGRESS = (
    "NCCL Suspend failed (requires NCCL 2.29.7+): NCCL operation in progress \n"
    "NCCL Last Error: (stand-in: a nonblocking communicator's suspend)"
)
WOULD_BLOCK = (
    "stand-in: memory_stats() on a lazy_init communicator before its first collective creates "
    "it (a collective bootstrap): a rank asking alone would block here"
)

#: WORLD's backend (the last splitting backend made while no default group existed).
_WORLD: dict[str, Any] = {}


class _Options:
    """A backend's options as torch hands them out, with the fields 2.15's nccl2 adds."""

    def __init__(self, inner: Any, **extra: Any) -> None:
        self._inner = inner
        self.__dict__.update(extra)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class SplittingGloo(s.SuspendableGloo):
    """A group made by splitting WORLD's communicator at creation (nccl2 on torch 2.15)."""

    supports_splitting = property(lambda self: True)
    supports_shrinking = property(lambda self: True)

    def split_from(self, op: str) -> None:
        """Run ``op`` (a split) on this communicator: collective over it, refused when it does
        not hold its memory (the suspendable stand-in's fault)."""
        self._enter(op)  # suspended: logged "refused", faulted, raises
        self._barrier(op)

    def shrink(self, ranks: Any, flags: Any = 0, options: Any = None) -> Any:
        """``ncclCommShrink`` over this communicator; the stand-in stops there (logged)."""
        self._enter("shrink")
        raise RuntimeError("stand-in: shrink is modelled up to the parent's communicator only")


def _create_split(store: Any, rank: int, size: int, timeout: Any) -> SplittingGloo:
    parent = _WORLD.get("backend") if dist.is_initialized() else None
    if parent is not None:
        parent.split_from("split")
    made = SplittingGloo(store, rank, size, timeout, name=SPLIT)
    if not dist.is_initialized():
        _WORLD["backend"] = made
    return s.track(made)


class LazyGloo(s.SuspendableGloo):
    """A ``lazy_init`` nccl2 communicator: created by its first collective."""

    def __init__(self, *args: Any, name: str = LAZY, **kwargs: Any) -> None:
        super().__init__(*args, name=name, **kwargs)
        self.initialized = False

    @property
    def options(self) -> Any:  # type: ignore[override]
        return _Options(super().options, lazy_init=True)

    def is_initialized(self) -> bool:
        """torch 2.15's ``Backend.isInitialized()`` (its Python name is unverified)."""
        return bool(self.initialized)

    def memory_stats(self) -> dict[str, int]:
        if not self.initialized:
            self._record("memory_stats", "would block")
            raise RuntimeError(WOULD_BLOCK)
        return super().memory_stats()


class NonblockingGloo(s.SuspendableGloo):
    """A communicator made by nccl2's ``reconfigure()``: nonblocking, its options unchanged."""

    def __init__(self, *args: Any, name: str = NONBLOCKING, **kwargs: Any) -> None:
        super().__init__(*args, name=name, **kwargs)

    @property
    def options(self) -> Any:  # type: ignore[override]
        config = types.SimpleNamespace(blocking=UNDEF_INT, split_share=UNDEF_INT)
        return _Options(super().options, enable_reconfigure=True, config=config)

    def suspend(self) -> None:
        self._record("suspend", f"raised: RuntimeError: {IN_PROGRESS.splitlines()[0]}")
        raise RuntimeError(IN_PROGRESS)


class ClassicNccl(s.SuspendableGloo):
    """Reads like torch's classic ``ProcessGroupNCCL`` (``name()`` is ``"nccl"``)."""

    def name(self) -> str:
        return "nccl"


ClassicNccl.__name__ = ClassicNccl.__qualname__ = "ProcessGroupNCCL"


class Nccl2(s.SuspendableGloo):
    """Reads like torch 2.15's ``ProcessGroupNCCL2`` (``name()`` is ``"nccl2"``)."""

    def name(self) -> str:
        return "nccl2"


Nccl2.__name__ = Nccl2.__qualname__ = "ProcessGroupNCCL2"


def _creator(cls: type, name: str) -> Any:
    def create(store: Any, rank: int, size: int, timeout: Any) -> Any:
        return s.track(cls(store, rank, size, timeout, name=name))

    return create


def register() -> list[str]:
    """Register every stand-in of this module (CPU devices); return their names."""
    creators = {
        SPLIT: _create_split,
        LAZY: _creator(LazyGloo, LAZY),
        NONBLOCKING: _creator(NonblockingGloo, NONBLOCKING),
        CLASSIC: _creator(ClassicNccl, CLASSIC),
        NCCL2: _creator(Nccl2, NCCL2),
    }
    for name, create in creators.items():
        if name not in dist.Backend.backend_list:
            # Registered as torch registers NCCL: for an accelerator only, so that the package
            # takes it for one; a group names its CPU leg itself (``nonblocking_backend``).
            devices = [s.ACCELERATOR] if name == NONBLOCKING else ["cpu"]
            dist.Backend.register_backend(name, create, devices=devices)
    return list(creators)


def nonblocking_backend() -> str:
    """A group on gloo for the CPU and the nonblocking stand-in for the pretend accelerator."""
    return f"cpu:gloo,{s.ACCELERATOR}:{NONBLOCKING}"


def world_backend() -> Any:
    """WORLD's splitting backend (None before one was made)."""
    return _WORLD.get("backend")


# ---- torch 2.15's pre-hook order ---------------------------------------------------------


class OrderedPreHooks:
    """torch 2.15's pre-hook dispatch (ascending id) on torch 2.14.1, for every group.

    ``install()`` replaces ``ProcessGroup.register_pre_hook`` / ``unregister_pre_hook`` (class
    attributes, which a call on a group finds first): a group's hooks go into a table here, and
    one real torch pre-hook (``DISPATCH_ID``) fires the table in ascending id order. A hook that
    raises stops the rest, and torch then issues nothing (as torch does).
    """

    DISPATCH_ID = 0x4F524452  # 'ORDR'

    def __init__(self) -> None:
        self.tables: dict[int, tuple[Any, dict[int, Any]]] = {}
        self.original: tuple[Any, Any] | None = None

    def install(self) -> OrderedPreHooks:
        cls = dist.ProcessGroup
        self.original = (cls.register_pre_hook, cls.unregister_pre_hook)
        model = self

        def register_pre_hook(pg: Any, hook_id: int, hook: Any) -> None:
            model.register(pg, hook_id, hook)

        def unregister_pre_hook(pg: Any, hook_id: int) -> None:
            model.unregister(pg, hook_id)

        cls.register_pre_hook = register_pre_hook  # type: ignore[method-assign]
        cls.unregister_pre_hook = unregister_pre_hook  # type: ignore[method-assign]
        return self

    def uninstall(self) -> None:
        if self.original is not None:
            cls = dist.ProcessGroup
            cls.register_pre_hook, cls.unregister_pre_hook = self.original  # type: ignore[method-assign]

    def register(self, pg: Any, hook_id: int, hook: Any) -> None:
        assert self.original is not None
        entry = self.tables.get(id(pg))
        if entry is None:
            table: dict[int, Any] = {}
            self.tables[id(pg)] = (pg, table)

            def dispatch(args: Any) -> None:
                for key in sorted(table):
                    table[key](args)

            self.original[0](pg, self.DISPATCH_ID, dispatch)
        else:
            table = entry[1]
        table[int(hook_id)] = hook  # an id registered again replaces its hook, as in torch

    def unregister(self, pg: Any, hook_id: int) -> None:
        assert self.original is not None
        entry = self.tables.get(id(pg))
        if entry is None:
            return
        entry[1].pop(int(hook_id), None)
        if not entry[1]:
            self.original[1](pg, self.DISPATCH_ID)
            del self.tables[id(pg)]

    def ids(self, pg: Any) -> list[int]:
        entry = self.tables.get(id(pg))
        return sorted(entry[1]) if entry is not None else []


class FlightRecorder:
    """torch's flight recorder, as far as a hook sees it: issued by the pre-hook, retired by
    the post-hook; an entry issued and never retired is what a hang dump would report."""

    def __init__(self) -> None:
        self.issued: dict[int, str] = {}
        self.retired: list[str] = []
        self.lock = threading.Lock()

    def pre(self, args: Any) -> None:
        with self.lock:
            self.issued[int(args.op_id)] = str(getattr(args.name, "name", args.name))

    def post(self, args: Any) -> None:
        with self.lock:
            name = self.issued.pop(int(args.op_id), None)
            if name is not None:
                self.retired.append(name)

    def in_flight(self) -> list[str]:
        with self.lock:
            return sorted(self.issued.values())


# ---- torch 2.15's _world.pg_flight_recorder_hooks ------------------------------------------

#: The backends whose groups get no recorder hook (2.15's ``_FR_SELF_RECORDING_BACKENDS``).
SELF_RECORDING = frozenset({"gloo", "nccl-legacy", "xccl", "fake", "undefined"})


class RecorderHandle:
    """2.15's ``FlightRecorderHook`` handle: it holds its group, and ``LIVE`` counts handles."""

    LIVE: weakref.WeakSet[RecorderHandle] = weakref.WeakSet()

    def __init__(self, pg: Any) -> None:
        self.pg = pg  # 2.15's handle holds an intrusive_ptr to the group
        RecorderHandle.LIVE.add(self)

    @staticmethod
    def alive() -> int:
        gc.collect()
        return len(RecorderHandle.LIVE)


class FlightRecorderMap:
    """``_world.pg_flight_recorder_hooks`` and its writers as torch 2.15 has them, on 2.13/2.14.

    The property on ``_World`` and the dict it returns (``_pg_flight_recorder_hooks``, an
    attribute of the ``_world`` object); a handle set for every group ``_new_process_group_helper``
    makes (WORLD included) unless every backend of the group records itself; popped for a
    group torch forgot (``destroy_process_group`` deletes the group from ``pg_map`` and then
    unregisters its name), cleared when torch unregisters every name (WORLD's destroy).
    """

    def install(self) -> FlightRecorderMap:
        world_type = type(c10d._world)
        if not hasattr(world_type, "pg_flight_recorder_hooks"):
            world_type.pg_flight_recorder_hooks = property(  # type: ignore[attr-defined]
                lambda w: w._pg_flight_recorder_hooks
            )
        c10d._world._pg_flight_recorder_hooks = {}  # type: ignore[attr-defined]
        helper = c10d._new_process_group_helper

        @functools.wraps(helper)
        def _new_process_group_helper(*args: Any, **kwargs: Any) -> Any:
            made = helper(*args, **kwargs)
            pg = made[0] if isinstance(made, tuple) else made
            backend = kwargs.get("backend", args[3] if len(args) > 3 else None)
            if isinstance(pg, dist.ProcessGroup) and _records_itself(backend) is False:
                c10d._world.pg_flight_recorder_hooks[pg] = RecorderHandle(pg)
            return made

        unregister = c10d._unregister_process_group
        unregister_all = c10d._unregister_all_process_groups

        @functools.wraps(unregister)
        def _unregister_process_group(name: Any) -> Any:
            hooks = c10d._world.pg_flight_recorder_hooks
            pg_map = c10d._world.pg_map
            for pg in [k for k in hooks if not dict.__contains__(pg_map, k)]:
                hooks.pop(pg, None)
            return unregister(name)

        @functools.wraps(unregister_all)
        def _unregister_all_process_groups() -> Any:
            c10d._world.pg_flight_recorder_hooks.clear()
            return unregister_all()

        c10d._new_process_group_helper = _new_process_group_helper
        c10d._unregister_process_group = _unregister_process_group
        c10d._unregister_all_process_groups = _unregister_all_process_groups
        return self

    @staticmethod
    def hooks() -> Any:
        return c10d._world.pg_flight_recorder_hooks

    @staticmethod
    def raw_keys() -> list[Any]:
        """Every key, aliases included (what ``len`` and loops may hide)."""
        return list(dict.keys(c10d._world.pg_flight_recorder_hooks))


def _records_itself(backend: Any) -> bool | None:
    try:
        config = c10d.BackendConfig(dist.Backend(str(backend)))
    except Exception:
        return None
    names = {str(name).lower() for name in config.get_device_backend_map().values()}
    return names <= SELF_RECORDING
