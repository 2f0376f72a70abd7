"""A new group: created by torch, recorded for reload, and handed out per the wrap policy.

Per the wrap policy a group is returned native, or recorded for reload and wrapped when this
rank is a member. A creation where this rank is not a member is recorded too: reload replays it
while a member needs the group, because torch creates groups collectively (a communicator
split, for instance). In native mode a member's group is recorded but handed out as torch's own
object, which reload reconfigures in place.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from .._originals import destroy_native, original
from ..errors import ModeRefusedError
from . import guard, mode, names, policy, process, registry, world
from .participants import is_registered
from .record import State, Way
from .reloadable import ReloadableProcessGroup

logger = logging.getLogger("reloadpg_autopatch")

_Native = dist.ProcessGroup


@functools.cache
def new_group_signature() -> inspect.Signature:
    """torch's own ``new_group`` signature, which every recorded creation is bound to."""
    return inspect.signature(original("new_group"))


def create(create_native: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Create a group with ``create_native`` (torch's ``new_group``); record and wrap it."""
    holder = process.current()
    if world.threaded_world():
        return create_native(*args, **kwargs)  # ranks are threads: see threaded_world()
    with holder.lock:
        world.check_world(holder)
    try:
        arguments = new_group_signature().bind(*args, **kwargs).arguments
    except TypeError:
        return create_native(*args, **kwargs)  # raises torch's own error
    wrap = dist.is_initialized() and policy.should_wrap(
        arguments.get("ranks"), arguments.get("backend"), is_registered()
    )
    if not wrap:
        return create_native(*args, **kwargs)

    # No lock of ours is held here: torch's new_group waits for the other ranks, which may be
    # threads of this process (a threaded world) or need this process to go on.
    def taken() -> set[str]:  # asked only for a hashed (local-sync) name
        with holder.lock:
            return {record.name for record in holder.records}

    with names.observing(taken) as seen:
        native = create_native(*args, **kwargs)
    with holder.lock:
        if holder.known_world is None:
            holder.known_world = c10d._world.default_pg
    if type(native) is _Native:
        try:
            in_place = _reloads_in_place(native)
        except RuntimeError:  # refused by the mode (or torch would not say): nothing leaks
            destroy_native(native)
            raise
        record = registry.add(args, kwargs, str(native.group_name), State.LIVE)
        record.native = native
        if in_place:
            record.way = Way.IN_PLACE
            mode.copy_as_handle()
            return native
        wrapper = ReloadableProcessGroup(native, None, _record=record)
        if guard.get_memory_guard().every_call:
            guard.arm(wrapper)  # slime's behaviour checks from the first collective on
        return wrapper
    if native is dist.GroupMember.NON_GROUP_MEMBER and seen.last is not None:
        registry.add(args, kwargs, seen.last, State.NON_MEMBER)
    elif native is not None and not isinstance(native, int):
        logger.debug("leaving %s native: new_group returned a custom class", type(native))
    return native


def _reloads_in_place(native: Any) -> bool:
    """Whether a new group reloads in place (the mode, and a WORLD that is not swapped)."""
    if not mode.reloads_in_place(native):
        return False
    if world.needs_swap():
        if mode.get_reload_mode() == "native":
            raise ModeRefusedError(
                f"group {native.group_name!r} cannot be reloaded in place: WORLD is registered "
                "and swapped for a temporary WORLD on destroy, which destroys every group; "
                "register WORLD in native mode too, or use mode 'auto'"
            )
        return False
    return True
