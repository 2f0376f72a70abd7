"""vime's lifecycle module, ``vime.utils.reloadable_process_group``: slime's older shape.

Written for this project from the notes on vime's public source (none of its code). It differs
from slime's module at v0.3.1 where vime does: no backend rewrite in its ``new_group`` (no
accelerator facade), ``nccl_world_destroyed`` instead of ``accelerator_world_destroyed``, only a
WORLD whose backend names ``nccl`` is swapped, and ``destroy_process_groups()`` still tears the
groups down one by one before destroying WORLD (the per-subgroup teardown slime replaced in
PR #2252). Its wrapper class, registries and unwrapping with no None check are slime's. The
``calls`` list records each call of this module's lifecycle functions, for the tests.
"""

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_group, _get_default_store
from vime.utils.distributed_utils import get_gloo_group, init_gloo_group, set_gloo_group

old_new_group_dict: dict = {}
default_process_group_states: dict = {}
calls: list = []

_UNWRAPPED = (
    "get_rank",
    "get_world_size",
    "get_backend",
    "get_process_group_ranks",
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "broadcast",
    "broadcast_object_list",
    "reduce_scatter_tensor",
    "barrier",
)


@dataclass
class _State:
    backend: str
    timeout: timedelta
    store: Any
    rank: int
    world_size: int
    generation: int = 0
    nccl_world_destroyed: bool = False


def register_default_process_group(timeout: timedelta) -> None:
    calls.append("register_default_process_group")
    if not dist.is_initialized():
        raise RuntimeError("Cannot register WORLD before torch.distributed is initialized")
    default_process_group_states[os.getpid()] = _State(
        str(dist.get_backend()),
        timeout,
        _get_default_store(),
        dist.get_rank(),
        dist.get_world_size(),
    )


def _unwrapping(function: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        args = tuple(a.group if isinstance(a, ReloadableProcessGroup) else a for a in args)
        kwargs = {
            k: (v.group if isinstance(v, ReloadableProcessGroup) else v) for k, v in kwargs.items()
        }
        return function(*args, **kwargs)

    return call


def monkey_patch_torch_dist() -> None:
    calls.append("monkey_patch_torch_dist")
    pid = os.getpid()
    if pid in old_new_group_dict:
        return
    old_new_group = dist.new_group
    old_new_group_dict[pid] = dist.old_new_group = old_new_group

    def new_group(*args: Any, **kwargs: Any) -> Any:
        group = old_new_group(*args, **kwargs)
        explicit = args[2] if len(args) > 2 else kwargs.get("backend")
        backend = str(explicit) if explicit is not None else str(dist.get_backend())
        registered = pid in default_process_group_states
        ranks = args[0] if args and args[0] is not None else kwargs.get("ranks")
        ranks = list(range(dist.get_world_size())) if ranks is None else ranks
        if not registered and (backend == "gloo" or len(ranks) == 1):
            return group
        return ReloadableProcessGroup(group, ranks, args, kwargs)

    dist.new_group = new_group
    for name in _UNWRAPPED:
        setattr(dist, name, _unwrapping(getattr(dist, name)))


class ReloadableProcessGroup(torch.distributed.ProcessGroup):
    GROUPS: dict = {}

    def __init__(self, group: Any, ranks: Any, args: tuple, kwargs: dict) -> None:
        super().__init__(dist.get_rank(group), dist.get_world_size(group))
        self.group = group
        self.group_info = {"ranks": ranks, "args": tuple(args), "kwargs": dict(kwargs)}
        ReloadableProcessGroup.GROUPS.setdefault(os.getpid(), []).append(self)

    def __getattr__(self, name: str) -> Any:
        if name == "group":
            raise AttributeError(name)
        return getattr(self.group, name)

    def rank(self) -> int:
        return self.group.rank()

    def size(self) -> int:
        return self.group.size()

    @staticmethod
    def destroy_process_groups() -> None:
        for group in ReloadableProcessGroup.GROUPS.get(os.getpid(), []):
            if group.group is not None:
                with contextlib.suppress(ValueError):
                    dist.destroy_process_group(group.group)
                group.group = None

    @staticmethod
    def reload_process_groups() -> None:
        create = old_new_group_dict.get(os.getpid())
        for group in ReloadableProcessGroup.GROUPS.get(os.getpid(), []):
            if group.group is None:
                group.group = create(*group.group_info["args"], **group.group_info["kwargs"])


def _new_world(state: _State, backend: str) -> None:
    state.generation += 1
    dist.init_process_group(
        backend=backend,
        store=dist.PrefixStore(f"vime-reloadable-world-{state.generation}-{backend}", state.store),
        rank=state.rank,
        world_size=state.world_size,
        timeout=state.timeout,
    )


def destroy_process_groups() -> None:
    """Each group torn down, then an NCCL WORLD swapped for a temporary gloo WORLD."""
    calls.append("destroy_process_groups")
    state = default_process_group_states.get(os.getpid())
    swaps = state is not None and not state.nccl_world_destroyed and "nccl" in state.backend
    if swaps:
        dist.barrier(group=get_gloo_group())
    ReloadableProcessGroup.destroy_process_groups()
    if swaps:
        dist.destroy_process_group()
        set_gloo_group(None)
        _new_world(state, "gloo")
        set_gloo_group(_get_default_group())
        state.nccl_world_destroyed = True


def reload_process_groups() -> None:
    calls.append("reload_process_groups")
    state = default_process_group_states.get(os.getpid())
    if state is not None and state.nccl_world_destroyed:
        dist.barrier()
        dist.destroy_process_group()
        set_gloo_group(None)
        _new_world(state, state.backend)
        init_gloo_group()
        state.nccl_world_destroyed = False
    ReloadableProcessGroup.reload_process_groups()
