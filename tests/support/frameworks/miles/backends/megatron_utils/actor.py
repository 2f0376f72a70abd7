"""miles' Megatron actor, ``miles.backends.megatron_utils.actor``, reduced to its lifecycle.

Written for this project from the notes on miles' public source: one import statement binding three
lifecycle names (miles registers no WORLD), ``init`` in miles' order, and miles' own guards:
``sleep()`` is idempotent through ``_asleep``; ``wake_up()`` while resident still calls
``reload_process_groups()`` (a reload with nothing destroyed before it); ``train()`` only wakes
(the driver's ``offload`` sleeps it); ``update_weights()`` reloads and destroys only when asleep.
"""

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from miles.utils.distributed_utils import get_gloo_group, init_gloo_group
from miles.utils.reloadable_process_group import (
    destroy_process_groups,
    monkey_patch_torch_dist,
    reload_process_groups,
)


class MegatronTrainRayActor:
    def init(self, args: Any, role: str = "actor", *, with_ref: bool = False) -> None:
        self.args = args
        self._asleep = False
        monkey_patch_torch_dist()
        dist.init_process_group(
            backend=args.distributed_backend,
            timeout=timedelta(minutes=args.distributed_timeout_minutes),
        )
        init_gloo_group()
        rank, size = dist.get_rank(), dist.get_world_size()
        self.pair = dist.new_group([0, 1])
        self.singletons = [dist.new_group([r]) for r in range(size)]
        self.everyone = dist.new_group(list(range(size)))
        self.mine = self.singletons[rank]
        dist.barrier(group=get_gloo_group())
        if args.offload_train:
            self.sleep()

    def sleep(self) -> None:
        if self._asleep:
            return  # miles logs "already asleep" and returns
        destroy_process_groups()
        self._asleep = True

    def wake_up(self) -> None:
        if not self._asleep:
            reload_process_groups()  # "ensuring process groups only"
            return
        reload_process_groups()
        self._asleep = False

    def train(self, rollout_id: int) -> float:
        if self._asleep:
            self.wake_up()
        value = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(value, group=self.everyone)
        if dist.get_rank() in (0, 1):
            dist.all_reduce(value, group=self.pair)
        return value.item()

    def offload(self) -> None:
        """What the driver broadcasts after training and saving: ``sleep``."""
        self.sleep()

    def update_weights(self) -> float:
        asleep = self.args.offload_train and self._asleep
        if asleep:
            reload_process_groups()
        dist.barrier(group=get_gloo_group())
        weights = torch.tensor([float(dist.get_rank() + 100)])
        dist.broadcast(weights, src=0, group=self.everyone)
        if asleep:
            destroy_process_groups()
        return weights.item()
