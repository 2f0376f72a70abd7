"""An actor in the shape of slime's Megatron actor, for the demo; it never imports the package.

Its lifecycle names are bound at import, from one statement, as slime's actor binds them;
``init`` joins WORLD from the environment (``env://``, as Ray's actor does), registers WORLD
unless ``SLIME_DESTROY_WORLD_PROCESS_GROUP`` is off, makes Megatron-like groups and sleeps; each
training step is two destroy/reload pairs (``train`` wakes and sleeps, ``update_weights``
reloads and destroys around the weight transfer).
"""

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .reloadable_process_group import (
    destroy_process_groups,
    monkey_patch_torch_dist,
    register_default_process_group,
    reload_process_groups,
)


class MegatronTrainRayActor:
    def init(self, args: Any) -> None:
        self.args = args
        monkey_patch_torch_dist()
        dist.init_process_group(
            backend=args.distributed_backend,
            timeout=timedelta(minutes=args.distributed_timeout_minutes),
        )
        if os.getenv("SLIME_DESTROY_WORLD_PROCESS_GROUP", "1").lower() not in {"0", "false", "no"}:
            register_default_process_group(
                timeout=timedelta(minutes=args.distributed_timeout_minutes)
            )
        rank, size = dist.get_rank(), dist.get_world_size()
        # Megatron's way: every rank makes every group, member or not.
        pairs = [dist.new_group([r, r + 1]) for r in range(0, size - 1, 2)]
        self.tensor_parallel = pairs[rank // 2] if rank // 2 < len(pairs) else None
        self.data_parallel = dist.new_group(list(range(size)))
        self.sleep()

    def sleep(self) -> None:
        destroy_process_groups()

    def wake_up(self) -> None:
        reload_process_groups()

    def train(self, rollout_id: int) -> float:
        """One step: every rank's ``rank + 1`` summed over data parallel, then over the pair."""
        self.wake_up()
        value = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(value, group=self.data_parallel)
        if self.tensor_parallel is not None:
            dist.all_reduce(value, group=self.tensor_parallel)
        self.sleep()
        return value.item()

    def update_weights(self) -> float:
        """The weight transfer: rank 0's ``100`` broadcast to every rank."""
        reload_process_groups()
        weights = torch.tensor([float(dist.get_rank() + 100)])
        dist.broadcast(weights, src=0, group=self.data_parallel)
        destroy_process_groups()
        return weights.item()
