"""Groups this package did not make reloadable come through WORLD's swap as they were.

torch's ``destroy_process_group()`` of WORLD shuts down every group in ``_world.pg_names``,
clears every ``_world`` map and unregisters every group name. The swap destroys a WORLD twice a
cycle, so a group the package did not make reloadable would end with it: slime's weight-update
group with the rollout engines (made by slime's copy of ``init_process_group``, torch's
``_new_process_group_helper`` on a store of its own), torchft's groups, a group the wrap policy
left torch's own (slime's Gloo group, made before WORLD's registration). On NCCL the side that
was not shut down (a rollout engine) would then wait on a dead communicator.

So such a group is left alone. Before torch's destroy, its entries are taken out of torch's maps
and its name out of the registry, where that destroy cannot reach them; once the new WORLD
stands (or could not be made) they are put back: the same objects, the same entries, the same
name. Nothing of it is shut down, aborted, freed or suspended, and its collectives run on its
own communicator while the package's groups sleep.

Where a torch keeps per-group state that the swap does not know how to carry (a ``_world``
structure not known here, a torchcomms communicator, which torch finalizes with WORLD), the
group could not come through as it was: ``obstacles`` says which and why, and WORLD's swap
way refuses the destroy on every rank before anything is freed (``ways.WorldSwap``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from torch.distributed import distributed_c10d as c10d

from .. import backends, process, registry
from ..ways.wrapper import ReloadableProcessGroup
from .end import native_world

logger = logging.getLogger("reloadpg_autopatch")

#: ``_world``'s maps that hold one entry per group: carried entry by entry.
MAPS = (
    "pg_map",
    "pg_names",
    "pg_group_ranks",
    "pg_backend_config",
    "pg_to_tag",
    "pg_coalesce_state",
    "pg_flight_recorder_hooks",  # torch 2.15
)
#: ``_world``'s map of tag -> groups: each group carried out of (and back into) its lists.
TAGS = "tags_to_pg"
#: ``_world``'s attributes that hold no group's own state: WORLD, the counter, a view made from
#: ``pg_map``, and the torchcomms communicators (checked per group: ``_torchcomms``).
NOT_PER_GROUP = frozenset({"default_pg", "group_count", "pg_config_info", "comms", "WORLD"})

#: Why a group is left alone, for reports.
OUTSIDE = "made outside new_group"
NATIVE = "left torch's own by new_group (the wrap policy)"


def note_native(group: Any) -> None:
    """``new_group`` handed out torch's own ``group``: if no record holds it, it is left alone
    because the wrap policy left it so (not because it was made elsewhere)."""
    name = getattr(group, "group_name", None)
    if name is not None:
        process.current().world.left_native.add(str(name))


def left_alone() -> list[Any]:
    """The groups torch knows here that no cycle of this package frees or brings back: every
    one but WORLD and the records' native groups, in the order torch made them."""
    world = c10d._world
    ours = {id(record.native) for record in registry.records() if record.native is not None}
    skip = {id(world.default_pg), id(native_world()), *ours}
    return [
        group
        for group in list(world.pg_names)
        if id(group) not in skip and not isinstance(group, ReloadableProcessGroup)
    ]


def name(group: Any) -> str:
    try:
        return str(c10d._world.pg_names.get(group) or group.group_name)
    except Exception:  # a foreign class that answers neither: its address
        return f"{type(group).__name__} at {id(group):#x}"


def describe(group: Any) -> dict[str, Any]:
    """What the report and the doctor say of a group left alone: its ranks, backend, why, and
    the memory its backends say they hold (``memory_stats()``, where a backend tells it)."""
    ranks = c10d._world.pg_group_ranks.get(group)
    config = c10d._world.pg_map.get(group)
    return {
        "ranks": sorted(ranks) if isinstance(ranks, dict) else None,
        "backend": str(config[0]) if config else None,
        "why": NATIVE if name(group) in process.current().world.left_native else OUTSIDE,
        "memory": _memory(group),
    }


def _memory(group: Any) -> dict[str, Any] | None:
    """``{device type: memory_stats()}`` of the backends that answer it (a local, cheap call on
    NCCL; gloo and most others do not support it)."""
    found = {}
    for device, backend in backends.device_backends(group):
        stats = getattr(backend, "memory_stats", None)
        if stats is None:
            continue
        try:
            answer = stats()
        except Exception as error:  # not supported, or no communicator yet: nothing to tell
            logger.debug("memory_stats() of a group left alone: %s", error)
            continue
        if isinstance(answer, dict):
            found[device.type] = {str(k): v for k, v in answer.items()}
    return found or None


def report(groups: list[Any]) -> dict[str, dict[str, Any]]:
    """``{name: describe(group)}`` for the cycle report."""
    return {name(group): describe(group) for group in groups}


# ---- where torch would reach them anyway -----------------------------------------------------


def _holds(value: Any, group: Any) -> bool:
    if isinstance(value, dict):
        return any(key is group for key in dict.keys(value)) or any(
            v is group for v in dict.values(value)
        )
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(item is group for item in value)
    return False


def _unknown_structures() -> dict[str, Any]:
    """``_world``'s public attributes (its properties and its own) the swap does not carry."""
    world = c10d._world
    names = {n for n, v in vars(type(world)).items() if isinstance(v, property)}
    names |= set(vars(world))
    found = {}
    for attribute in sorted(names):
        if attribute.startswith("_") or attribute in NOT_PER_GROUP:
            continue
        if attribute in MAPS or attribute == TAGS:
            continue
        try:
            found[attribute] = getattr(world, attribute)
        except Exception as error:  # a property of a torch we do not know that fails
            logger.debug("_world.%s cannot be read: %s", attribute, error)
    return found


def _torchcomms(group: Any) -> bool:
    """Whether a backend of ``group`` is a torchcomms communicator, which torch finalizes for
    every group when WORLD is destroyed (``_world.comms``)."""
    wrapper = getattr(c10d, "_BackendWrapper", None)
    if not isinstance(wrapper, type):
        return False
    return any(isinstance(backend, wrapper) for _, backend in backends.device_backends(group))


def obstacles(groups: list[Any]) -> list[str]:
    """Why WORLD's swap would reach each of ``groups`` anyway, a line each (none on torch 2.13
    and 2.14, whose per-group state the swap carries whole)."""
    found = []
    unknown = _unknown_structures() if groups else {}
    for group in groups:
        held = sorted(a for a, value in unknown.items() if _holds(value, group))
        if held:
            where = ", ".join(f"_world.{a}" for a in held)
            found.append(
                f"group {name(group)!r} ({OUTSIDE} or left torch's own): this torch also keeps "
                f"it in {where}, which reloadpg_autopatch does not know how to keep across "
                "WORLD's swap"
            )
        if _torchcomms(group):
            found.append(
                f"group {name(group)!r}: its backend is a torchcomms communicator, which torch "
                "finalizes with WORLD (_world.comms)"
            )
    return found


# ---- carried across torch's destroy of WORLD -------------------------------------------------


def _maps() -> dict[str, dict[Any, Any]]:
    world = c10d._world
    found = {}
    for attribute in MAPS:
        value = getattr(world, attribute, None)  # pg_flight_recorder_hooks: torch 2.15 on
        if isinstance(value, dict):
            found[attribute] = value
    return found


def _resolved(label: str) -> Any:
    try:
        return c10d._resolve_process_group(label)
    except Exception:  # not registered
        return None


@contextlib.contextmanager
def carried() -> Iterator[list[Any]]:
    """Around torch's destroy of WORLD and the start of the next: the groups left alone are out
    of torch's reach in the block and back as they were after it, whatever the block raised."""
    groups = left_alone()
    if not groups:
        yield groups
        return
    taken: list[tuple[Any, str, Any, dict[str, Any], list[str]]] = []
    maps = _maps()
    tags = c10d._world.tags_to_pg
    for group in groups:
        label = name(group)
        entries = {a: dict.pop(m, group) for a, m in maps.items() if dict.__contains__(m, group)}
        in_tags = [tag for tag, listed in tags.items() if any(g is group for g in listed)]
        for tag in in_tags:
            tags[tag][:] = [g for g in tags[tag] if g is not group]
        taken.append((group, label, _resolved(label), entries, in_tags))
    try:
        yield groups
    finally:
        maps = _maps()
        tags = c10d._world.tags_to_pg
        for group, label, resolved, entries, in_tags in taken:
            for attribute, entry in entries.items():
                if attribute in maps:
                    dict.__setitem__(maps[attribute], group, entry)
            for tag in in_tags:
                tags.setdefault(tag, []).append(group)
            if resolved is not None and _resolved(label) is not resolved:
                with contextlib.suppress(Exception):  # none registered under it: register
                    c10d._unregister_process_group(label)
                c10d._register_process_group(label, resolved)
        logger.debug(
            "left %d groups alone across WORLD's swap: %s",
            len(taken),
            ", ".join(label for _, label, *_ in taken),
        )


__all__ = ["carried", "describe", "left_alone", "note_native", "obstacles", "report"]
