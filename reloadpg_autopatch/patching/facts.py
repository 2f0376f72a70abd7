"""What the patching layer knows about itself, for the doctor: what it replaced in torch, the
references still holding torch's originals, its wrappers in ``distributed_c10d`` and in
``torch.compile``'s remap table.

Each function returns plain data and the problems it sees in the user's words.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from .. import _env
from . import dynamo, patchset


def patch() -> dict[str, Any]:
    """The torch version, and whether and what ``torch.distributed`` is patched with (and
    whether another patch wraps ``new_group`` on top of ours)."""
    patched = patchset.is_patched()
    return {
        "version": torch.__version__,
        "distributed_available": dist.is_available(),
        "patched": patched,
        "patched_functions": patchset.patched_names(),
        "outer_patch_on_new_group": patched
        and dist.new_group is not patchset.current().wrappers["new_group"],
    }


def stale() -> tuple[list[dict[str, str]], list[str]]:
    """Every attribute of a loaded module that still holds one of torch's originals."""
    from .sweep import find_stale

    found = [{"module": s.module, "attribute": s.attribute} for s in find_stale("*")]
    if not found:
        return found, []
    names = ", ".join(f"{s['module']}.{s['attribute']}" for s in found[:10])
    return found, [
        f"{len(found)} stale reference(s) still hold torch's unpatched "
        f"functions: {names}; add their packages to {_env.REBIND_ENV} or call "
        "reloadpg_autopatch.rebind([...]) after importing them"
    ]


def c10d_wrappers() -> tuple[dict[str, Any], list[str]]:
    """How many of our wrappers ``distributed_c10d`` holds too, which are in the namespace
    only, and which something put torch's original back over."""
    current = patchset.current()
    in_c10d = sorted(n for n in current.installed if n in current.c10d)
    displaced = [n for n in in_c10d if getattr(c10d, n, None) is not current.c10d[n]]
    facts = {
        "installed": len(in_c10d),
        "namespace_only": sorted(current.installed - set(current.c10d)),
        "displaced": displaced,
    }
    if not displaced:
        return facts, []
    return facts, ["distributed_c10d no longer holds our wrappers of: " + ", ".join(displaced)]


def compile_remaps(waiting_for: Callable[[str], bool]) -> tuple[dict[str, Any], list[str]]:
    """Whether ``torch.compile``'s remap table knows our wrappers; before its module is loaded,
    whether something waits for it to register them (``waiting_for(module)``: the start-up
    layer's finder, which this layer does not import)."""
    if dynamo.MODULE in sys.modules:
        remaps = dynamo.report()
        if not remaps["missing"]:
            return {"loaded": True, **remaps}, []
        return {"loaded": True, **remaps}, [
            "torch.compile does not know our wrappers of "
            + ", ".join(remaps["missing"])
            + ": fullgraph compilation of them fails; patch before compiling anything"
        ]
    waiting = waiting_for(dynamo.MODULE)
    facts = {"loaded": False, "waiting": waiting}
    if patchset.current().complete and not waiting:
        return facts, [
            f"{dynamo.MODULE} is not loaded and nothing waits for it: torch.compile will "
            "not know our wrappers"
        ]
    return facts, []
