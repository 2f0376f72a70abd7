"""Holds torch's own ``all_reduce`` (the original behind the wrapper), as a stale module would.

Imported by a rank after start-up with ``SLIME_RELOADABLE_PG_REBIND`` naming this module: the
sweep must visit it when it finishes importing and point ``all_reduce`` at the wrapper.
"""

import torch.distributed as dist

all_reduce = getattr(dist.all_reduce, "__wrapped__", dist.all_reduce)
