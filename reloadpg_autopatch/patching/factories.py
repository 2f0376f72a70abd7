"""Wrappers for the ``torch.distributed`` functions that create or destroy groups.

``new_group`` hands each creation to the group lifecycle, which records it (member or not) so
that reload can replay it, and wraps it per the wrap policy. ``destroy_process_group`` releases
a reloadable group for good, or, given WORLD, ends every group of that world.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from ..groups import lifecycle, policy, world
from .wrapgen import mark


def make_new_group(original: Callable[..., Any], namespace: Any) -> Callable[..., Any]:
    """``new_group`` that returns reloadable groups per the wrap policy.

    When another framework has patched ``torch.distributed.new_group`` on top of ours, it owns
    wrapping: we hand it native groups, so nothing is wrapped twice.
    """
    signature = inspect.signature(original)

    def new_group(*args: Any, **kwargs: Any) -> Any:
        native = original(*args, **kwargs)
        if namespace.new_group is not new_group:
            return native  # an outer patch calls us and wraps the result itself
        arguments = signature.bind(*args, **kwargs).arguments
        if not policy.should_wrap(
            arguments.get("ranks"), arguments.get("backend"), world.is_registered()
        ):
            return native
        return lifecycle.adopt(native, args, kwargs)

    return mark(new_group, original)


def make_destroy_process_group(original: Callable[..., Any]) -> Callable[..., Any]:
    """``destroy_process_group`` that understands reloadable groups.

    Given a reloadable group (or its native handle) it releases it for good: reload will not
    revive it. Given WORLD (or nothing) torch destroys every group, and so does the lifecycle.
    """
    signature = inspect.signature(original)

    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        try:
            group = signature.bind(*args, **kwargs).arguments.get("group")
        except TypeError:
            return original(*args, **kwargs)  # raises torch's own error
        if lifecycle.release(group):
            return None
        native = lifecycle.unwrap(group)
        if native is not None and native is not dist.GroupMember.WORLD:
            return original(native)
        result = original(native)
        lifecycle.end_world()
        return result

    return mark(destroy_process_group, original)
