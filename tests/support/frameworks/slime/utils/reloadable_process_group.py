"""slime's lifecycle module, ``slime.utils.reloadable_process_group``, as the tests need it.

Written for this project from the notes on slime's public source (none of its code): the names
and signatures an actor imports, the per-pid registries, the wrapper class with ``.group`` that
becomes None on destroy, and the unwrapping of that class by its patched ``torch.distributed``
functions **with no None check**, which is slime's own behaviour and the misroute of issue 29
(after a destroy, torch receives ``group=None`` and runs on the default group).

As slime at v0.3.1 and after: its patched ``new_group`` first rewrites backend ``"nccl"`` to
the accelerator's (``slime.utils.accelerator.process_group_backend``, PR #2216: ``mccl`` on
MUSA), and once WORLD is registered it wraps every group, gloo and single-rank ones included;
``destroy_process_groups()`` of an accelerator WORLD (``nccl``, ``mccl``) destroys WORLD once
(PR #2252: torch then shuts down every group it knows), drops its wrappers' groups, and starts a
temporary gloo WORLD that also serves as the Gloo group; ``reload_process_groups()`` restores
the accelerator WORLD and a new Gloo group (PR #2208), then re-creates every wrapper's group.
With a gloo WORLD it takes the per-group path.

Left out, because the tests run on CPU: the memory check around each collective. The
``.calls`` list records each lifecycle call that reached this module's own functions, for the
tests (slime has no such list).
"""

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from slime.utils import accelerator
from slime.utils.distributed_utils import get_gloo_group, init_gloo_group, set_gloo_group
from torch.distributed.distributed_c10d import _get_default_group, _get_default_store

logger = logging.getLogger(__name__)

#: pid -> the ``new_group`` this module's patch replaced.
old_new_group_dict: dict = {}
#: pid -> WORLD's registration.
default_process_group_states: dict = {}
#: Each call of this module's lifecycle functions, in order (the tests' oracle).
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
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "gather",
    "gather_object",
    "barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "_coalescing_manager",
)


@dataclass
class _DefaultProcessGroupState:
    backend: str
    timeout: timedelta
    store: Any
    rank: int
    world_size: int
    generation: int = 0
    accelerator_world_destroyed: bool = False


def _uses_accelerator_backend(backend: str) -> bool:
    return accelerator.is_accelerator_backend(backend)


def register_default_process_group(timeout: timedelta) -> None:
    """Record WORLD's backend, store, rank, size and timeout for this pid."""
    calls.append("register_default_process_group")
    if not dist.is_initialized():
        raise RuntimeError("register_default_process_group() needs torch.distributed initialized")
    default_process_group_states[os.getpid()] = _DefaultProcessGroupState(
        backend=str(dist.get_backend()),
        timeout=timeout,
        store=_get_default_store(),
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
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
    """Patch ``torch.distributed`` once per pid: ``new_group`` wraps, the rest unwraps."""
    calls.append("monkey_patch_torch_dist")
    pid = os.getpid()
    if pid in old_new_group_dict:
        assert dist.old_new_group == old_new_group_dict[pid]
        return
    old_new_group = dist.new_group
    old_new_group_dict[pid] = old_new_group
    dist.old_new_group = old_new_group

    def new_group(*args: Any, **kwargs: Any) -> Any:
        explicit = args[2] if len(args) > 2 else kwargs.get("backend")
        backend = str(explicit) if explicit is not None else str(dist.get_backend())
        if backend == "nccl" and accelerator.process_group_backend(backend) != backend:
            backend = accelerator.process_group_backend(backend)
            if len(args) > 2:
                args = (*args[:2], backend, *args[3:])
            else:
                kwargs = {**kwargs, "backend": backend}
        group = old_new_group(*args, **kwargs)
        ranks = args[0] if args else kwargs.get("ranks")
        size = dist.get_world_size() if ranks is None else len(ranks)
        registered = os.getpid() in default_process_group_states
        if not registered and (str(backend).lower() == "gloo" or size == 1):
            return group
        # A rank outside ``ranks`` gets a wrapper too (of torch's NON_GROUP_MEMBER), so that
        # every rank re-creates every group at reload, in the same order, as torch requires.
        return ReloadableProcessGroup(
            group,
            ranks,
            creation_args=args,
            creation_kwargs=kwargs,
            backend=backend,
        )

    dist.new_group = new_group
    for name in _QUERIES + _COLLECTIVES:
        setattr(dist, name, _unwrapping(getattr(dist, name)))


class ReloadableProcessGroup(torch.distributed.ProcessGroup):
    """A group whose native group (``.group``) is destroyed and re-created by this module."""

    GROUPS: dict = {}

    def __init__(
        self,
        group: Any,
        ranks: Any,
        *,
        creation_args: tuple = (),
        creation_kwargs: Any = None,
        backend: str = "nccl",
    ) -> None:
        super().__init__(dist.get_rank(group), dist.get_world_size(group))
        self.group = group
        self.group_info = {
            "ranks": ranks,
            "args": tuple(creation_args),
            "kwargs": dict(creation_kwargs or {}),
            "backend": backend,
        }
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

    def name(self) -> str:
        return self._fwd("name")

    def barrier(self, *args: Any, **kwargs: Any) -> Any:
        return self._fwd("barrier", *args, **kwargs)

    def broadcast(self, *args: Any, **kwargs: Any) -> Any:
        return self._fwd("broadcast", *args, **kwargs)

    def allreduce(self, *args: Any, **kwargs: Any) -> Any:
        return self._fwd("allreduce", *args, **kwargs)

    def allgather(self, *args: Any, **kwargs: Any) -> Any:
        return self._fwd("allgather", *args, **kwargs)

    def _allgather_base(self, *args: Any, **kwargs: Any) -> Any:
        return self._fwd("_allgather_base", *args, **kwargs)

    def _reduce_scatter_base(self, *args: Any, **kwargs: Any) -> Any:
        return self._fwd("_reduce_scatter_base", *args, **kwargs)

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
    def invalidate_process_groups() -> None:
        for group in ReloadableProcessGroup.GROUPS.get(os.getpid(), []):
            group.group = None

    @staticmethod
    def reload_process_groups() -> None:
        create = old_new_group_dict[os.getpid()]
        for group in ReloadableProcessGroup.GROUPS.get(os.getpid(), []):
            if group.group is None:
                info = group.group_info
                group.group = create(*info["args"], **info["kwargs"])


def _new_world(state: _DefaultProcessGroupState, backend: str) -> None:
    state.generation += 1
    dist.init_process_group(
        backend=backend,
        store=dist.PrefixStore(f"reloadable-world-{state.generation}-{backend}", state.store),
        rank=state.rank,
        world_size=state.world_size,
        timeout=state.timeout,
    )


def destroy_process_groups() -> None:
    """An accelerator WORLD: destroyed once, a temporary gloo WORLD in its place (which also
    serves as the Gloo group); else every wrapper's native group freed one by one."""
    calls.append("destroy_process_groups")
    state = default_process_group_states.get(os.getpid())
    if state is None or state.accelerator_world_destroyed:
        ReloadableProcessGroup.destroy_process_groups()
        return
    if not _uses_accelerator_backend(state.backend):
        ReloadableProcessGroup.destroy_process_groups()
        return
    dist.barrier(group=get_gloo_group())
    dist.destroy_process_group()  # torch shuts down every group it knows
    ReloadableProcessGroup.invalidate_process_groups()
    set_gloo_group(None)
    _new_world(state, "gloo")
    set_gloo_group(_get_default_group())
    state.accelerator_world_destroyed = True


def reload_process_groups() -> None:
    """The accelerator WORLD restored (and a new Gloo group), then every destroyed wrapper's
    native group re-created; live ones are left alone."""
    calls.append("reload_process_groups")
    state = default_process_group_states.get(os.getpid())
    if state is not None and state.accelerator_world_destroyed:
        dist.barrier()
        dist.destroy_process_group()
        set_gloo_group(None)
        _new_world(state, state.backend)
        init_gloo_group()
        state.accelerator_world_destroyed = False
    ReloadableProcessGroup.reload_process_groups()


__all__ = [
    "ReloadableProcessGroup",
    "default_process_group_states",
    "destroy_process_groups",
    "get_gloo_group",
    "init_gloo_group",
    "monkey_patch_torch_dist",
    "old_new_group_dict",
    "register_default_process_group",
    "reload_process_groups",
    "set_gloo_group",
]
