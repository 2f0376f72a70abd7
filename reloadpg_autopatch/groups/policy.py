"""Which new groups become reloadable.

slime's rule, the default (``"auto"``): groups that hold no accelerator memory (their backend
serves the CPU, as gloo does) and single-rank groups stay native, unless WORLD is registered
for reload, because destroying WORLD tears down every group torch knows, those included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Union

import torch.distributed as dist

from . import settings
from .backends import holds_accelerator_memory


@dataclass(frozen=True)
class GroupSpec:
    """What a policy callable sees about a group being created."""

    ranks: tuple[int, ...]
    backend: str
    world_registered: bool


PolicyCallable = Callable[[GroupSpec], bool]
Policy = Union[str, PolicyCallable]

POLICIES = ("auto", "all", "none")


def set_wrap_policy(policy: Policy) -> None:
    """Choose which groups ``new_group`` makes reloadable.

    ``"auto"`` (default): all but CPU-backend (gloo) and single-rank groups, and every group
    once WORLD is registered; ``"all"``: every group; ``"none"``: none (the patch then only
    unwraps); or a callable taking a ``GroupSpec`` and returning whether to wrap.
    """
    if not (callable(policy) or policy in POLICIES):
        raise ValueError(
            f"wrap policy must be one of {', '.join(map(repr, POLICIES))} or a callable "
            f"taking a GroupSpec, got {policy!r}"
        )
    held = settings.current()
    with held.lock:
        held.policy = policy


def get_wrap_policy() -> Policy:
    """The policy in force in this process."""
    return settings.current().policy


def may_suspend(ranks: Sequence[int] | None) -> bool:
    """Whether a group the rule leaves alone is still asked if it can suspend: under the
    ``"auto"`` policy, in the ``suspend`` and ``auto`` reload modes, for more than one rank."""
    from .mode import get_reload_mode

    if settings.current().policy != "auto" or get_reload_mode() not in ("suspend", "auto"):
        return False
    return (dist.get_world_size() if ranks is None else len(tuple(ranks))) > 1


def should_wrap(ranks: Sequence[int] | None, backend: object, world_registered: bool) -> bool:
    """Apply the policy in force to a group with these ranks and this (resolved) backend."""
    policy = settings.current().policy
    if policy == "all":
        return True
    if policy == "none":
        return False
    resolved_ranks = tuple(range(dist.get_world_size())) if ranks is None else tuple(ranks)
    resolved_backend = str(backend) if backend else str(dist.get_backend())
    if callable(policy):
        return bool(policy(GroupSpec(resolved_ranks, resolved_backend, world_registered)))
    if world_registered:
        return True
    return holds_accelerator_memory(resolved_backend) and len(resolved_ranks) > 1
