"""A lifecycle module in slime's shape (``slime.utils.reloadable_process_group``), for the demo.

It never runs when the package adopts it (the demo's default); with
``SLIME_RELOADABLE_PG_ADOPT=0`` it is the program's lifecycle, as slime's is: its patch wraps
every group ``new_group`` makes once WORLD is registered, and its destroy and reload destroy and
re-create each wrapper's native group.
"""

import contextlib
import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

old_new_group_dict: dict = {}
default_process_group_states: dict = {}


def register_default_process_group(timeout: timedelta) -> None:
    if not dist.is_initialized():
        raise RuntimeError("register_default_process_group() needs torch.distributed initialized")
    default_process_group_states[os.getpid()] = {"backend": dist.get_backend(), "timeout": timeout}


def monkey_patch_torch_dist() -> None:
    pid = os.getpid()
    if pid in old_new_group_dict:
        assert dist.old_new_group == old_new_group_dict[pid]
        return
    old_new_group = old_new_group_dict[pid] = dist.old_new_group = dist.new_group

    def new_group(*args: Any, **kwargs: Any) -> Any:
        group = old_new_group(*args, **kwargs)
        ranks = args[0] if args else kwargs.get("ranks")
        size = dist.get_world_size() if ranks is None else len(ranks)
        if pid not in default_process_group_states and size == 1:
            return group
        return ReloadableProcessGroup(group, ranks, creation_args=args, creation_kwargs=kwargs)

    def unwrapping(function: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            args = tuple(a.group if isinstance(a, ReloadableProcessGroup) else a for a in args)
            kwargs = {
                k: v.group if isinstance(v, ReloadableProcessGroup) else v
                for k, v in kwargs.items()
            }
            return function(*args, **kwargs)

        return call

    dist.new_group = new_group
    for name in ("get_rank", "get_world_size", "all_reduce", "broadcast", "barrier"):
        setattr(dist, name, unwrapping(getattr(dist, name)))


class ReloadableProcessGroup(dist.ProcessGroup):
    GROUPS: dict = {}

    def __init__(
        self, group: Any, ranks: Any, *, creation_args: Any = (), creation_kwargs: Any = None
    ) -> None:
        super().__init__(dist.get_rank(group), dist.get_world_size(group))
        self.group = group
        self.group_info = {"ranks": ranks, "args": creation_args, "kwargs": creation_kwargs or {}}
        ReloadableProcessGroup.GROUPS.setdefault(os.getpid(), []).append(self)

    def __getattr__(self, name: str) -> Any:
        if name == "group":
            raise AttributeError(name)
        return getattr(self.group, name)

    @staticmethod
    def destroy_process_groups() -> None:
        for group in ReloadableProcessGroup.GROUPS.get(os.getpid(), []):
            if group.group is not None:
                with contextlib.suppress(ValueError):  # not a member: nothing of it here
                    dist.destroy_process_group(group.group)
                group.group = None

    @staticmethod
    def reload_process_groups() -> None:
        for group in ReloadableProcessGroup.GROUPS.get(os.getpid(), []):
            if group.group is None:
                info = group.group_info
                group.group = old_new_group_dict[os.getpid()](*info["args"], **info["kwargs"])


def destroy_process_groups() -> None:
    ReloadableProcessGroup.destroy_process_groups()


def reload_process_groups() -> None:
    ReloadableProcessGroup.reload_process_groups()
