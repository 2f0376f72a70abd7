"""slime's ``slime.utils.distributed_utils``: the canonical Gloo group and a second WORLD.

Written for this project from the notes on slime's public source (none of its code):

- ``init_gloo_group()`` makes the canonical Gloo group once, with the ``new_group`` its
  lifecycle patch replaced (``torch.distributed.old_new_group``) when that patch ran, so that
  the group stays raw; ``get_gloo_group()`` raises until it exists; ``set_gloo_group()``
  replaces it (slime's WORLD path swaps it for the temporary WORLD and back);
- ``init_process_group(...)`` is slime's copy of torch's, which lets the trainer's rank 0 make
  the weight-update group with the rollout engines: a group made by torch's
  ``_new_process_group_helper`` on a store of its own, never through ``new_group``, whose
  ranks slime then writes into ``_world.pg_group_ranks`` itself.
"""

from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

GLOO_GROUP = None


def init_gloo_group():
    """Create the canonical Gloo group (every rank of WORLD) once, and keep it."""
    global GLOO_GROUP
    if GLOO_GROUP is None:
        GLOO_GROUP = getattr(dist, "old_new_group", dist.new_group)(backend="gloo")
    return GLOO_GROUP


def get_gloo_group():
    if GLOO_GROUP is None:
        raise RuntimeError("Gloo group has not been initialized. Call init_gloo_group() first.")
    return GLOO_GROUP


def set_gloo_group(group):
    global GLOO_GROUP
    GLOO_GROUP = group


def init_process_group(  # noqa: PLR0917 - torch's signature, as slime copies it
    backend: Any = None,
    init_method: Any = None,
    timeout: Any = None,
    world_size: int = -1,
    rank: int = -1,
    store: Any = None,
    group_name: Any = None,
    pg_options: Any = None,
) -> Any:
    """A group of ``world_size`` ranks on its own store, beside WORLD (slime's weight-update
    group between the trainer and the rollout engines)."""
    if timeout is None:
        timeout = timedelta(minutes=30)
    if store is None:
        store, rank, world_size = next(c10d.rendezvous(init_method, rank, world_size, timeout))
        store.set_timeout(timeout)
        store = dist.PrefixStore(group_name, store)
    group, _ = c10d._new_process_group_helper(
        world_size,
        rank,
        [],
        dist.Backend(backend or "undefined"),
        store,
        group_name=group_name,
        backend_options=pg_options,
        timeout=timeout,
    )
    c10d._world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group
