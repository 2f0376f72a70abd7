"""The points where torch splits a parent's communicator, taught to refuse a sleeping parent.

``split_group`` and ``shrink_group`` make a group's NCCL communicator from the parent's
(``ncclCommSplit``, ``ncclCommShrink``), a backend call that no pre-hook sees. Every path to a
split ends in ``ProcessGroup.split_group`` (torch's ``split_group()``, which DeviceMesh bound by
name at import, calls it on the parent), and every ``shrink_group`` passes
``distributed_c10d._validate_shrink_backend_requirements`` right before ``backend.shrink``.
The wrappers made here ask the lifecycle first (``groups.world.splits``), which refuses while the
parent sleeps; ``install.guard_splits`` puts them in place. ``new_group`` asks in the lifecycle's
``create``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .wrapgen import mark


def _splits() -> Any:
    # Imported at the first split, not when the patch is applied (inside ``import torch``).
    from ..groups.world import splits

    return splits


def make_split_group(original: Callable[..., Any]) -> Callable[..., Any]:
    """``ProcessGroup.split_group`` that refuses to split a sleeping parent (``self``)."""

    def split_group(self: Any, *args: Any, **kwargs: Any) -> Any:
        _splits().refuse_split("split_group()", self)
        return original(self, *args, **kwargs)

    return mark(split_group, original)


def make_shrink_check(original: Callable[..., Any]) -> Callable[..., Any]:
    """``_validate_shrink_backend_requirements`` that refuses to shrink a sleeping parent."""

    def _validate_shrink_backend_requirements(group_info: Any, *args: Any, **kwargs: Any) -> Any:
        parent = group_info.get("process_group") if isinstance(group_info, dict) else None
        if parent is not None:
            _splits().refuse_split("shrink_group()", parent)
        return original(group_info, *args, **kwargs)

    return mark(_validate_shrink_backend_requirements, original)
