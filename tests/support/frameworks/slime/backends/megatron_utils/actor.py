"""slime's Megatron actor, ``slime.backends.megatron_utils.actor``, reduced to its lifecycle.

Written for this project from the notes on slime's public source: the one import statement
that binds the four lifecycle names at import, and the order ``init`` calls them in
(``monkey_patch_torch_dist()``; WORLD joined as Ray's train actor joins it, through ``env://``,
on the accelerator's backend (``slime.utils.accelerator.process_group_backend``);
the canonical Gloo group; ``register_default_process_group(timeout=...)`` unless
``SLIME_DESTROY_WORLD_PROCESS_GROUP`` is ``0``, ``false`` or ``no``; Megatron's groups; a first
``sleep()``), and the two destroy/reload pairs of each training step (``train`` wakes and sleeps,
``update_weights`` reloads and destroys around the transfer, and meets the other ranks on the
Gloo group first). Training and the weight transfer are one collective each, whose results the
tests check. Nothing here knows reloadpg_autopatch.
"""

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from slime.utils import accelerator
from slime.utils.distributed_utils import get_gloo_group, init_gloo_group
from slime.utils.reloadable_process_group import (
    destroy_process_groups,
    monkey_patch_torch_dist,
    register_default_process_group,
    reload_process_groups,
)


class MegatronTrainRayActor:
    def init(self, args: Any, role: str = "actor", with_ref: bool = False) -> None:
        self.args = args
        monkey_patch_torch_dist()
        # slime/ray/train_actor.py: WORLD from the environment Ray set, then the Gloo group.
        dist.init_process_group(
            backend=accelerator.process_group_backend(args.distributed_backend),
            timeout=timedelta(minutes=args.distributed_timeout_minutes),
        )
        init_gloo_group()
        if os.getenv("SLIME_DESTROY_WORLD_PROCESS_GROUP", "1").lower() not in {"0", "false", "no"}:
            register_default_process_group(
                timeout=timedelta(minutes=args.distributed_timeout_minutes)
            )
        # Megatron's parallel state: every rank creates every group, as Megatron does.
        rank, size = dist.get_rank(), dist.get_world_size()
        self.pair = dist.new_group([0, 1])
        self.singletons = [dist.new_group([r]) for r in range(size)]
        self.everyone = dist.new_group(list(range(size)))
        self.mine = self.singletons[rank]
        dist.barrier(group=get_gloo_group())
        if args.offload_train:
            self.sleep()

    def sleep(self) -> None:
        assert self.args.offload_train
        destroy_process_groups()

    def wake_up(self) -> None:
        assert self.args.offload_train
        reload_process_groups()

    def train(self, rollout_id: int) -> float:
        """One training step: the sum of every rank's ``rank + 1`` over Megatron's groups."""
        if self.args.offload_train:
            self.wake_up()
        value = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(value, group=self.everyone)
        if dist.get_rank() in (0, 1):
            dist.all_reduce(value, group=self.pair)
        dist.all_reduce(value, group=self.mine)
        if self.args.offload_train:
            self.sleep()
        return value.item()

    def update_weights(self) -> float:
        """The weight transfer: rank 0's value broadcast over every rank, after rank 0's plan
        has been broadcast over the Gloo group (an object collective, for which torch looks the
        group up in its maps)."""
        if self.args.offload_train:
            reload_process_groups()
        dist.barrier(group=get_gloo_group())
        plan = [{"from": dist.get_rank()}]
        dist.broadcast_object_list(plan, src=0, group=get_gloo_group())
        assert plan == [{"from": 0}], plan
        weights = torch.tensor([float(dist.get_rank() + 100)])
        dist.broadcast(weights, src=0, group=self.everyone)
        if self.args.offload_train:
            destroy_process_groups()
        return weights.item()

    def save_model(self, rollout_id: int) -> None:
        if self.args.offload_train:
            self.wake_up()
        dist.barrier(group=self.everyone)
        if self.args.offload_train:
            self.sleep()
