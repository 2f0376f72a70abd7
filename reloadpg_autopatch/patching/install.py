"""Install wrappers into torch's namespaces: the one write path, below the patch and factories.

``apply`` installs the wrappers it is given, in ``torch.distributed`` and where torch defines
each one, all or none. In native mode only the lifecycle's functions are installed at first;
``complete`` installs the rest the moment something needs them (a group behind a wrapper, an
outer layer that wraps groups itself), with Dynamo's table and torch's own bindings updated.
"""

from __future__ import annotations

import logging
import sys
import types
from typing import Any

from . import dynamo, patchset, sweep

logger = logging.getLogger("reloadpg_autopatch")


def apply(patch: patchset.PatchSet, names: set[str]) -> None:
    """Install the wrappers of ``names`` (all or none: a failure puts torch's back)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    done: list[tuple[types.ModuleType, str, Any]] = []
    try:
        for module, wrappers in ((dist, patch.wrappers), (c10d, patch.c10d)):
            for name, wrapper in wrappers.items():
                if name in names:
                    done.append((module, name, getattr(module, name)))
                    setattr(module, name, wrapper)
    except BaseException:
        for module, name, previous in reversed(done):
            setattr(module, name, previous)
        raise
    patch.mark_installed(names)


def lifecycle_only() -> bool:
    """No group needs a wrapper: every way the mode may choose keeps torch's own object and
    this torch can do it (``ways.lifecycle_only``). Should one need a wrapper after all (WORLD
    swapped, an outer layer), ``complete`` installs the rest then."""
    from ..groups import ways

    return ways.lifecycle_only()


def complete(reason: str) -> None:
    """Install the wrappers left out in native mode, now that ``reason`` needs them."""
    with patchset.LOCK:
        patch = patchset.current()
        if patch is None or patch.complete:
            return
        apply(patch, set(patch.wrappers) - patch.installed)
        dynamo.register(patch, load="torch.distributed._functional_collectives" in sys.modules)
        rebound = sweep.rebind_torch()
        logger.info(
            "installed the collective wrappers too (%s); rebound %d bindings", reason, len(rebound)
        )
    sweep.rebind(None)


def guard_splits() -> list[str]:
    """Make torch's split points refuse a sleeping parent (``split_points``); idempotent.

    Each is looked up, not assumed: a torch without one (``shrink_group`` is recent) keeps
    what it has. Returns the names it changed.
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from . import split_points
    from .wrapgen import is_generated

    points = (
        (dist.ProcessGroup, "split_group", split_points.make_split_group),
        (c10d, "_validate_shrink_backend_requirements", split_points.make_shrink_check),
    )
    changed = []
    for owner, name, make in points:
        current = getattr(owner, name, None)
        if current is None or is_generated(current):
            continue
        setattr(owner, name, make(current))
        changed.append(name)
    if changed:
        logger.debug("split points that refuse a sleeping parent: %s", ", ".join(changed))
    return changed
