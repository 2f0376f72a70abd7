"""Create a recorded group again, under its name, with keys of this cycle.

Reload creates a group again with the arguments it was first created with, under the name it
always had (``names.forcing``), bounded by WORLD's timeout (a missing peer fails within it, not
within the group's own default of 30 minutes), and gives it back its own timeout and what was
registered on it since (``Record.replays``: its hooks, its memory pools).
"""

from __future__ import annotations

import functools
import inspect
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from .._originals import original
from . import faults, names, pools, process
from .backends import device_backends
from .record import Record
from .store import channel

_Native = dist.ProcessGroup


@functools.cache
def new_group_signature() -> inspect.Signature:
    """torch's own ``new_group`` signature, which every recorded creation is bound to."""
    return inspect.signature(original("new_group"))


def creation_call(
    record: Record, bound: timedelta
) -> tuple[tuple[Any, ...], dict[str, Any], list[int]]:
    """The record's ``new_group`` arguments with a timeout of at most ``bound``, and its ranks.

    The group's own timeout (the one it last had, ``set_timeout`` included) is given back once
    it exists; its rendezvous must not outwait WORLD's.
    """
    arguments = new_group_signature().bind(*record.args, **record.kwargs)
    own = record.timeout
    arguments.arguments["timeout"] = bound if own is None else min(own, bound)
    ranks = arguments.arguments.get("ranks")
    members = list(range(channel.world_size())) if ranks is None else sorted(ranks)
    return arguments.args, arguments.kwargs, members


def create_again(record: Record) -> Any:
    """Create the record's group again, under its name; a missing peer fails within WORLD's
    timeout with an error naming the group, the cycle and the ranks that did not come."""
    holder = process.current()
    bound = channel.world_timeout()
    args, kwargs, members = creation_call(record, bound)
    store = channel.base_store()
    # One key for every creation of this reload, not one per group: a member that failed at
    # another creation (stuck behind the same missing peer) has still marked itself there.
    key = holder.key("reload", "create", channel.token())
    if record.published is not None:  # published while destroyed: torch registers the new one
        names.withdraw(record.name)
    started = time.monotonic()
    try:
        with names.forcing(record.name):
            native = original("new_group")(*args, **kwargs)
    except Exception as error:
        raise faults.failure(
            f"reload_process_groups(): creating group {record.name!r} (ranks {members})",
            channel.where("reload"),
            store=store,
            key=key,
            ranks=members,
            rank=channel.global_rank(),
            timeout=bound,
            started=started,
            error=error,
        ) from error
    if record.timeout is not None and record.timeout > bound and type(native) is _Native:
        for _device, backend in device_backends(native):
            restore = getattr(backend, "_set_default_timeout", None)  # gloo's and nccl's have it
            if restore is not None:
                restore(record.timeout)
    return native


def replay(record: Record, native: Any) -> None:
    """Register on ``native`` again what was registered on the record's group since."""
    for entry in record.replays:
        method, args, kwargs = entry
        if method == pools.ENTRY:
            pools.replay(native, entry, f"group {record.name!r}")
        else:
            getattr(native, method)(*args, **kwargs)
