"""Which new groups become reloadable.

slime's rule, the default (``"auto"``): gloo-only groups and single-rank groups hold no
accelerator memory, so they stay native, unless WORLD is registered for reload, because
destroying WORLD tears down every group torch knows, gloo and single-rank ones included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Union

import torch.distributed as dist


@dataclass(frozen=True)
class GroupSpec:
    """What a policy callable sees about a group being created."""

    ranks: tuple[int, ...]
    backend: str
    world_registered: bool


PolicyCallable = Callable[[GroupSpec], bool]
Policy = Union[str, PolicyCallable]

POLICIES = ("auto", "all", "none")
_policy: Policy = "auto"


def set_wrap_policy(policy: Policy) -> None:
    """Choose which groups ``new_group`` makes reloadable.

    ``"auto"`` (default): all but gloo-only and single-rank groups, and every group once WORLD
    is registered; ``"all"``: every group; ``"none"``: none (the patch then only unwraps);
    or a callable taking a ``GroupSpec`` and returning whether to wrap.
    """
    global _policy
    if not (callable(policy) or policy in POLICIES):
        raise ValueError(
            f"wrap policy must be one of {', '.join(map(repr, POLICIES))} or a callable "
            f"taking a GroupSpec, got {policy!r}"
        )
    _policy = policy


def get_wrap_policy() -> Policy:
    """The policy in force in this process."""
    return _policy


def backend_names(backend: object) -> tuple[str, ...]:
    """The backend names inside a backend string such as ``"cpu:gloo,cuda:nccl"``."""
    names = []
    for part in str(backend).lower().split(","):
        name = part.rsplit(":", 1)[-1].strip()
        if name:
            names.append(name)
    return tuple(names)


def should_wrap(ranks: Sequence[int] | None, backend: object, world_registered: bool) -> bool:
    """Apply the policy in force to a group with these ranks and this (resolved) backend."""
    policy = _policy
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
    gloo_only = set(backend_names(resolved_backend)) <= {"gloo"}
    return not gloo_only and len(resolved_ranks) > 1
