"""miles' lifecycle module, ``miles.utils.reloadable_process_group``, as the tests need it.

Written for this project from the notes on miles' public source (none of its code). It differs
from slime's where miles does: no WORLD registration, no ``invalidate_process_groups``, no
registry of WORLD's state; the wrapper is built as ``(group, inner_args, inner_kwargs)`` and
keeps no ranks; ``new_group`` leaves a group raw when its backend is named ``gloo`` or it has one
rank; the patched collectives leave out ``broadcast_object_list`` (which miles' Megatron-Bridge
plugin works around) and unwrap ``.group`` with no None check. ``calls`` records each call of
this module's lifecycle functions, for the tests.
"""

import logging
import os
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

old_new_group_dict: dict = {}
calls: list = []

_QUERIES = (
    "get_rank",
    "get_world_size",
    "get_backend",
    "get_global_rank",
    "get_group_rank",
    "get_process_group_ranks",
)
_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "gather",
    "barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "_coalescing_manager",
)


def _unwrapping(function: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        args = tuple(a.group if isinstance(a, ReloadableProcessGroup) else a for a in args)
        kwargs = {
            k: (v.group if isinstance(v, ReloadableProcessGroup) else v) for k, v in kwargs.items()
        }
        return function(*args, **kwargs)

    call.__name__ = getattr(function, "__name__", "call")
    return call


def monkey_patch_torch_dist() -> None:
    calls.append("monkey_patch_torch_dist")
    pid = os.getpid()
    if pid in old_new_group_dict:
        assert dist.old_new_group == old_new_group_dict[pid]
        return
    old_new_group = dist.new_group
    old_new_group_dict[pid] = old_new_group
    dist.old_new_group = old_new_group

    def new_group(*args: Any, **kwargs: Any) -> Any:
        group = old_new_group(*args, **kwargs)
        ranks = args[0] if args else kwargs.get("ranks")
        backend = args[2] if len(args) > 2 else kwargs.get("backend")
        if backend == "gloo" or (ranks is not None and len(ranks) == 1):
            return group
        return ReloadableProcessGroup(group, inner_args=args, inner_kwargs=kwargs)

    dist.new_group = new_group
    for name in _QUERIES + _COLLECTIVES:
        setattr(dist, name, _unwrapping(getattr(dist, name)))


class ReloadableProcessGroup(torch.distributed.ProcessGroup):
    GROUPS: dict = {}

    def __init__(self, group: Any, inner_args: Any, inner_kwargs: Any) -> None:
        super().__init__(dist.get_rank(group), dist.get_world_size(group))
        self.group = group
        self.inner_args = inner_args
        self.inner_kwargs = inner_kwargs
        ReloadableProcessGroup.GROUPS.setdefault(os.getpid(), []).append(self)

    def __getattr__(self, name: str) -> Any:
        if name == "group":
            raise AttributeError(name)
        return getattr(self.group, name)

    def _fwd(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self.group is None:
            raise RuntimeError("ReloadableProcessGroup: inner PG is None, call reload() first.")
        return getattr(self.group, method)(*args, **kwargs)

    def rank(self) -> int:
        return self._fwd("rank")

    def size(self) -> int:
        return self._fwd("size")

    def barrier(self, *args: Any, **kwargs: Any) -> Any:
        return self._fwd("barrier", *args, **kwargs)

    def broadcast(self, *args: Any, **kwargs: Any) -> Any:
        return self._fwd("broadcast", *args, **kwargs)

    def allreduce(self, *args: Any, **kwargs: Any) -> Any:
        return self._fwd("allreduce", *args, **kwargs)

    def allgather(self, *args: Any, **kwargs: Any) -> Any:
        return self._fwd("allgather", *args, **kwargs)

    @staticmethod
    def destroy_process_groups() -> None:
        for group in ReloadableProcessGroup.GROUPS.get(os.getpid(), []):
            if group.group is None:
                continue
            try:
                dist.destroy_process_group(group.group)
            except ValueError as error:
                logger.warning("destroying a group failed: %s", error)
            del group.group
            group.group = None

    @staticmethod
    def reload_process_groups() -> None:
        create = old_new_group_dict[os.getpid()]
        for group in ReloadableProcessGroup.GROUPS.get(os.getpid(), []):
            if group.group is None:
                group.group = create(*group.inner_args, **group.inner_kwargs)


def destroy_process_groups() -> None:
    calls.append("destroy_process_groups")
    ReloadableProcessGroup.destroy_process_groups()


def reload_process_groups() -> None:
    calls.append("reload_process_groups")
    ReloadableProcessGroup.reload_process_groups()
