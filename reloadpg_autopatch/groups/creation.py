"""A new group: created by torch, recorded for reload, and handed out per the wrap policy.

Per the wrap policy a group is returned native, or recorded for reload and wrapped when this
rank is a member. A creation where this rank is not a member is recorded too: reload replays it
while a member needs the group, because torch creates groups collectively (a communicator
split, for instance). In native mode a member's group is recorded but handed out as torch's own
object, which reload reconfigures in place.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ..errors import ReloadPGError
from . import frees, guard, names, policy, process, registry, torch_class, ways
from .record import State
from .recreation import new_group_signature
from .stepping import threaded_world
from .ways.wrapper import WRAPPER, ReloadableProcessGroup
from .world import facts, settings_round, splits
from .world.end import check_world

logger = logging.getLogger("reloadpg_autopatch")

_Native = dist.ProcessGroup


def refuse_while_asleep(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``new_group(*args, **kwargs)`` refused while WORLD's communicator it would split from
    sleeps, or where the ranks' settings differ (for a creation this package does not wrap:
    an outer layer wraps it)."""
    try:
        arguments = new_group_signature().bind(*args, **kwargs).arguments
    except TypeError:
        return  # torch raises its own error
    _agree_settings(arguments)
    splits.refuse_new_group(arguments.get("backend"))


def _agree_settings(arguments: dict[str, Any]) -> None:
    """Before any rank creates or refuses a group: every rank's settings, compared once per
    world, where every rank takes part (a local-sync creation is its members' only)."""
    if dist.is_initialized() and not arguments.get("use_local_synchronization"):
        settings_round.agree_once("new_group()")


def create(create_native: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Create a group with ``create_native`` (torch's ``new_group``); record and wrap it.

    Refused first (``GroupSuspendedError``) when its communicator would be split from a
    sleeping WORLD's (``splits``)."""
    holder = process.current()
    if threaded_world():
        return create_native(*args, **kwargs)  # ranks are threads: see threaded_world()
    with holder.lock:
        check_world(holder)
    try:
        arguments = new_group_signature().bind(*args, **kwargs).arguments
    except TypeError:
        return create_native(*args, **kwargs)  # raises torch's own error
    _agree_settings(arguments)
    # Before torch is called: its communicator may be split from a sleeping WORLD's.
    splits.refuse_new_group(arguments.get("backend"))
    wrap = dist.is_initialized() and facts.wraps(arguments.get("ranks"), arguments.get("backend"))
    # The policy reads backend names; suspend reads torch's answers. In suspend and auto modes
    # a group the name-based rule leaves alone is asked once it exists, and taken if it can
    # suspend, whatever device its backend is registered for (a plugin, a test backend).
    ask = not wrap and dist.is_initialized() and policy.may_suspend(arguments.get("ranks"))
    if not wrap and not ask:
        return create_native(*args, **kwargs)

    # No lock of ours is held here: torch's new_group waits for the other ranks, which may be
    # threads of this process (a threaded world) or need this process to go on.
    def taken() -> set[str]:  # asked only for a hashed (local-sync) name
        with holder.lock:
            return {record.name for record in registry.records()}

    with names.observing(taken) as seen:
        native = create_native(*args, **kwargs)
    with holder.lock:
        registry.belong_to(c10d._world.default_pg)
    if type(native) is _Native:
        if ask and ways.declined(native):
            # The rule's answer stands: it stays torch's, ours to leave alone (and named at
            # the destroy's agreement, in case a peer's answer differs).
            return native
        try:
            way = facts.choose_group_way(native)
        except RuntimeError:  # refused by the mode (or torch would not say): nothing leaks
            with contextlib.suppress(ReloadPGError):  # a peer kept it: aborted, not waited on
                frees.destroy(native, f"group {str(native.group_name)!r} (refused)")
            raise
        if way is None:
            return ways.left_alone(native)  # a CPU group in suspend mode: it stays awake
        record = registry.add(args, kwargs, str(native.group_name), State.LIVE, way)
        record.native = native
        if way.torch_object:
            torch_class.handed()
            return native
        wrapper = ReloadableProcessGroup(native, None, _record=record)
        if guard.get_memory_guard().every_call:
            guard.arm(wrapper)  # slime's behaviour checks from the first collective on
        return wrapper
    if native is dist.GroupMember.NON_GROUP_MEMBER and seen.last is not None:
        # Recorded also when its members were only to be asked whether it can suspend: where
        # they cannot all suspend it, they destroy it behind its wrapper (torch 2.13) and
        # create it again, collectively, with this rank; where they suspend it or keep it
        # resident, the reload leaves it to them (``Way.elsewhere_step``).
        registry.add(args, kwargs, seen.last, State.NON_MEMBER, WRAPPER)
    elif native is not None and not isinstance(native, int):
        logger.debug("leaving %s native: new_group returned a custom class", type(native))
    return native
