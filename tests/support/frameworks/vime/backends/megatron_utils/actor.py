"""vime's Megatron actor, ``vime.backends.megatron_utils.actor``, reduced to its lifecycle.

Written for this project from the notes on vime's public source: the import statement binding
the four lifecycle names at import, and ``init`` in slime's order (vime is a slime fork): its
patch, WORLD through ``env://``, the Gloo group, WORLD registered, Megatron's groups, a first
sleep; one step wakes, trains and sleeps. Nothing here knows reloadpg_autopatch.
"""

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from vime.utils.distributed_utils import get_gloo_group, init_gloo_group
from vime.utils.reloadable_process_group import (
    destroy_process_groups,
    monkey_patch_torch_dist,
    register_default_process_group,
    reload_process_groups,
)


class MegatronTrainRayActor:
    def init(self, args: Any) -> None:
        self.args = args
        monkey_patch_torch_dist()
        timeout = timedelta(minutes=args.distributed_timeout_minutes)
        dist.init_process_group(backend=args.distributed_backend, timeout=timeout)
        init_gloo_group()
        register_default_process_group(timeout=timeout)
        self.pair = dist.new_group([0, 1])
        self.everyone = dist.new_group(list(range(dist.get_world_size())))
        dist.barrier(group=get_gloo_group())
        destroy_process_groups()

    def train(self, rollout_id: int) -> float:
        """Wake, sum every rank's ``rank + 1`` over all ranks then over [0, 1], sleep."""
        reload_process_groups()
        value = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(value, group=self.everyone)
        if dist.get_rank() in (0, 1):
            dist.all_reduce(value, group=self.pair)
        dist.barrier(group=get_gloo_group())
        destroy_process_groups()
        return value.item()
