"""Turn any process-group wrapper into the native group torch can dispatch on."""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from .._env import ADOPT_ENV
from ..errors import GroupDestroyedError, ReloadPGError
from . import memory
from .ways.wrapper import ReloadableProcessGroup

_Native = dist.ProcessGroup
_MAX_DEPTH = 16


def _compiling() -> bool:
    # Looked up at call time: torch.distributed (and so this module) is imported while torch
    # itself is still importing, before torch.compiler exists.
    return torch.compiler.is_compiling()


_MISSING = object()


def unwrap(group: Any) -> Any:
    """Return the native ``ProcessGroup`` inside ``group``; anything else comes back unchanged.

    Our own ``ReloadableProcessGroup`` and *foreign* wrappers (any ``ProcessGroup`` subclass
    instance that keeps its native group in ``.group``, as slime's and its forks' classes do)
    are unwrapped recursively. A wrapper whose native group is gone raises ``GroupDestroyedError``
    rather than handing torch ``None``, which torch would silently read as the default group.
    """
    cls = type(group)
    if cls is _Native or group is None:
        return group
    if cls is ReloadableProcessGroup:
        inner = group._fast
        if inner is not None:
            return inner
    return _unwrap_nested(group)


def _unwrap_nested(group: Any) -> Any:
    if _compiling():
        # Dynamo reports a native group's type as something else and refuses any attribute
        # read on it: leave the group as it is. A call that needs the real group graph-breaks
        # in torch's own function, and then runs eagerly through this wrapper again.
        return group
    for _ in range(_MAX_DEPTH):
        cls = type(group)
        if cls is _Native or group is None:
            return group
        if not isinstance(group, _Native):
            return group
        if isinstance(group, ReloadableProcessGroup):
            # Destroyed or asleep (the error: it names the call), or armed by the memory
            # guard (which runs now).
            what = "passed to torch.distributed"
            if group.is_destroyed:
                what = _patched_caller() or what
            return group.live(what)
        inner = getattr(group, "group", _MISSING)
        if inner is None:
            raise GroupDestroyedError(_foreign_destroyed(group, _patched_caller()))
        if inner is group or not isinstance(inner, _Native):
            return group
        group = inner
    raise ReloadPGError(f"process group wrappers nest deeper than {_MAX_DEPTH} levels")


def _foreign_ranks(group: Any) -> Any:
    """The ranks a foreign wrapper was created with, read from its own attributes (slime's
    ``group_info``, miles' ``inner_args``/``inner_kwargs``), never through its ``__getattr__``."""
    own = getattr(group, "__dict__", None) or {}
    info = own.get("group_info")
    if isinstance(info, dict) and info.get("ranks") is not None:
        return info["ranks"]
    args, kwargs = own.get("inner_args") or (), own.get("inner_kwargs") or {}
    if isinstance(kwargs, dict) and kwargs.get("ranks") is not None:
        return kwargs["ranks"]
    return args[0] if isinstance(args, (tuple, list)) and args else None


#: Where this package's lifecycle functions live: a framework module whose
#: ``reload_process_groups`` comes from here was adopted.
_OURS = "reloadpg_autopatch."


def _adopted(module_name: str) -> bool:
    """Whether the framework module ``module_name`` is adopted: its ``reload_process_groups``
    is this package's, which never restores a wrapper of the framework's class."""
    reload = getattr(sys.modules.get(module_name), "reload_process_groups", None)
    return str(getattr(reload, "__module__", "")).startswith(_OURS)


def _foreign_destroyed(group: Any, call: str | None) -> str:
    """The refusal of a foreign wrapper whose ``.group`` is None: the group, the call, the fix."""
    cls = type(group)
    what = f"{cls.__module__}.{cls.__qualname__}"
    ranks = _foreign_ranks(group)
    what += f" of ranks {list(ranks)!r}" if isinstance(ranks, (list, tuple, range)) else ""
    adopted = _adopted(cls.__module__)
    who = "its framework's class" if adopted else "its framework"
    said = (
        f"{what} (at {id(group):#x}) was passed to {call or 'torch.distributed'} with no "
        f"native group: its .group is None, because {who} destroyed it. torch would read None "
        "as the default group and run the call on WORLD; "
    )
    if not adopted:
        return said + "call the framework's reload_process_groups() before using the group"
    return said + (
        f"{cls.__module__} is adopted by reloadpg_autopatch, so its reload_process_groups() is "
        "reloadpg_autopatch's, which restores the groups torch.distributed.new_group() makes "
        f"and never a wrapper of {cls.__qualname__}: make the group with "
        "torch.distributed.new_group() (reloadpg_autopatch then destroys and restores it with "
        f"the others), or keep the framework's own lifecycle with {ADOPT_ENV}=0"
    )


_C10D = "torch.distributed.distributed_c10d"


def _patched_caller() -> str | None:
    """The torch.distributed call that is unwrapping (for an error): the function whose
    patched wrapper it is, the class whose constructor it is (``P2POp()``, not ``__new__``),
    or torch's own public function reading a group it was handed inside an object (a
    ``P2POp`` made earlier, read by ``batch_isend_irecv``)."""
    frame = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return None
        namespace = frame.f_globals
        name = frame.f_code.co_name
        if namespace.get("__rpg_unwrap") is unwrap:  # a wrapper ``wrapgen`` made
            if name in ("__new__", "__init__"):  # a patched class's constructor
                owner = getattr(namespace.get("__rpg_target"), "__qualname__", "")
                name = owner.rpartition(".")[0] or name
            return f"torch.distributed.{name}()"
        if namespace.get("__name__") == _C10D and not name.startswith("_"):
            return f"torch.distributed.{name}()"
        frame = frame.f_back
    return None


#: How long a collective that lost its connection waits to learn that this rank destroyed its
#: group: the peer's destroy closes the connection a moment before this rank's own destroy.
INTERRUPT_GRACE_S = 2.0


def interrupted(given: Any, native: Any, error: BaseException) -> BaseException | None:
    """The error for a collective on ``given`` that failed because its group was destroyed.

    A thread blocked in a collective while the group is destroyed (here, or first by a peer,
    which closes the connection under it) gets the package's message naming the group and the
    fix, not the transport's. Any other failure keeps its own error (None). Runs on the error
    path only.
    """
    if not isinstance(given, ReloadableProcessGroup):
        return None
    deadline = time.monotonic() + (INTERRUPT_GRACE_S if "onnection" in str(error) else 0.0)
    while given.group is native:
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
    return given.destroyed_error("a collective it ran was interrupted by the destroy")


def failed(given: Any, native: Any, error: BaseException) -> BaseException | None:
    """A collective on a non-native group failed: ``interrupted``'s error, with the figures.

    Whatever is raised carries a note with the accelerator memory figures of the group's
    device (``memory.note``), where there is a memory query for it.
    """
    said = interrupted(given, native, error)
    memory.note(said if said is not None else error, native)
    return said


def failed_native(native: Any, error: BaseException) -> None:
    """A collective on a native group (or the default one) failed: add the memory note."""
    memory.note(error, native)
