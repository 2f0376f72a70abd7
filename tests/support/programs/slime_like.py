"""A minimal model of slime's late patch, written for the tests (no slime code).

Its wrapper class overrides only the ``ProcessGroup`` method names of torch before 2.13, its
``new_group`` wraps whatever the previous ``new_group`` returns, and its collectives unwrap
its own class and call the previous function. Like slime, it records the ``new_group`` it wraps
as ``torch.distributed.old_new_group``. That is the shape of slime's
``monkey_patch_torch_dist()`` as applied in its Megatron actor, after Megatron was imported.
"""

from __future__ import annotations

from typing import Any


def apply() -> tuple[type, Any, Any]:
    """Patch ``torch.distributed``; return the wrapper class and destroy/reload callables."""
    import torch.distributed as dist

    class SlimeLikeGroup(dist.ProcessGroup):
        def __init__(self, group: Any, args: tuple, kwargs: dict) -> None:
            super().__init__(group.rank(), group.size())
            self.group = group
            self.args, self.kwargs = args, kwargs

        def allreduce(self, *a: Any, **k: Any) -> Any:
            return self.group.allreduce(*a, **k)

        def allgather(self, *a: Any, **k: Any) -> Any:
            return self.group.allgather(*a, **k)

        def _allgather_base(self, *a: Any, **k: Any) -> Any:
            return self.group._allgather_base(*a, **k)

        def _reduce_scatter_base(self, *a: Any, **k: Any) -> Any:
            return self.group._reduce_scatter_base(*a, **k)

        def rank(self) -> int:
            return self.group.rank()

        def size(self) -> int:
            return self.group.size()

    previous_new_group = dist.new_group
    dist.old_new_group = previous_new_group  # slime declares its layer so, and wraps itself
    created: list[SlimeLikeGroup] = []

    def new_group(*args: Any, **kwargs: Any) -> SlimeLikeGroup:
        group = SlimeLikeGroup(previous_new_group(*args, **kwargs), args, kwargs)
        created.append(group)
        return group

    def unwrapping(func: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            args = tuple(a.group if isinstance(a, SlimeLikeGroup) else a for a in args)
            kwargs = {k: v.group if isinstance(v, SlimeLikeGroup) else v for k, v in kwargs.items()}
            return func(*args, **kwargs)

        return wrapper

    for name in ("all_reduce", "all_gather_into_tensor", "barrier", "get_rank"):
        setattr(dist, name, unwrapping(getattr(dist, name)))
    dist.new_group = new_group

    def destroy() -> None:
        for group in created:
            dist.destroy_process_group(group.group)
            group.group = None

    def reload() -> None:
        for group in created:
            group.group = previous_new_group(*group.args, **group.kwargs)

    return SlimeLikeGroup, destroy, reload
