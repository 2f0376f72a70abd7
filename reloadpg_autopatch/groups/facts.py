"""What the lifecycle knows about itself, for the doctor: the reload mode and what it does
with each backend in use, what the wrapper forwards, the reloadable groups and their names in
torch's maps, the memory guard, the reload hooks, what a destroy releases first and the last
cycle.

The answers come from what the lifecycle decides with (``ways.explain`` asks the same ways
``ways.choose`` does), so the doctor cannot tell another story. Each function returns plain
data and the problems it sees in the user's words.
"""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from .. import _env
from . import aliases, hooks, lifecycle, memory, mode, releases, ways
from . import guard as memory_guard
from .ways import inplace
from .ways.wrapper import ReloadableProcessGroup
from .ways.wrapper.group import forwarding_report
from .world import facts as world


def modes() -> tuple[dict[str, Any], list[str]]:
    """The reload mode in force, and for each backend in use here which action applies and
    why (``ways.explain``); a problem for each backend the mode refuses."""
    chosen = mode.get_reload_mode()
    backends: dict[str, str] = {}
    problems: list[str] = []
    for each in [*world.held(), *lifecycle.reloadable_groups()]:
        # The native group, also behind a wrapper that sleeps (its record keeps it).
        group = each
        if isinstance(each, ReloadableProcessGroup):
            group = each.group or each._record.native
        if group is None:
            continue  # destroyed behind its wrapper: no backend to ask until the reload
        try:
            name = str(dist.get_backend(group))
        except Exception:  # torch no longer knows it (its WORLD ended): its C++ name
            name = str(group._get_backend_name())
        if name not in backends:
            backends[name], problem = ways.explain(group, name)
            problems += [problem] if problem is not None else []
    if not inplace.torch_can_reconfigure() and chosen != "wrapper":
        why = inplace.in_place_refusal(None)
        backends.setdefault("every other backend", f"behind a wrapper: {why}")
    facts = {"mode": chosen, "variable": os.environ.get(_env.MODE_ENV), "backends": backends}
    return facts, problems


def forwarding() -> dict[str, list[str]]:
    """Which members of this torch's ``ProcessGroup`` the wrapper forwards (``methods``,
    ``properties``), and which it leaves to the class it inherits from (``inherited``)."""
    return forwarding_report()


def names() -> tuple[dict[str, Any], list[str]]:
    """The reloadable groups, the aliases that make torch's maps answer for them, and whether
    each one's name resolves to it in torch's registry."""
    live = lifecycle.reloadable_groups()
    wrong = []
    for group in live:
        native = getattr(group, "group", None)
        if native is None:  # in place (no wrapper), or destroyed right now
            continue
        name = str(native.group_name)
        try:
            resolved = c10d._resolve_process_group(name)
        except RuntimeError as error:
            wrong.append(f"{name!r} does not resolve: {error}")
            continue
        if resolved is not group and resolved is not native:
            wrong.append(f"{name!r} resolves to another group")
        if group not in c10d._world.pg_group_ranks:
            wrong.append(f"{name!r} is unknown to torch's maps")
    facts = {
        "reloadable": len(live),
        "aliases": aliases.count(),
        "maps_answer_for_wrappers": aliases.installed() or not live,
        "inconsistent": wrong,
    }
    return facts, ["group names or maps are inconsistent: " + "; ".join(wrong)] if wrong else []


def cycle() -> dict[str, Any]:
    """The guard's settings, the reload hooks, what each destroy releases first, and the last
    cycle's report of this process."""
    guard = memory_guard.get_memory_guard()
    last = lifecycle.last_cycle_report()
    return {
        "guard": {
            "min_free_gb": guard.min_free_gb,
            "every_call": guard.every_call,
            "probe": "torch" if memory.probe_is_default() else "custom",
        },
        "hooks": hooks.registered(),
        "releases": releases.describe(),
        "last": last.to_dict() if last is not None else None,
    }
