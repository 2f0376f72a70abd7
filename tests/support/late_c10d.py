"""Binds torch.distributed functions straight from ``distributed_c10d``, as user code does.

Rank functions import this module only after start-up (never at the top of a test module), so
its names are bound after ``torch.distributed`` finished importing and the gate did its work.
"""

from torch.distributed.distributed_c10d import (
    _coalescing_manager,
    all_reduce,
    broadcast_object_list,
    get_process_group_ranks,
)

__all__ = ["_coalescing_manager", "all_reduce", "broadcast_object_list", "get_process_group_ranks"]
