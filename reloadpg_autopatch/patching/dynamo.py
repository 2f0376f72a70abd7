"""Teach Dynamo our wrappers: the keys of its collective remap table.

``torch.compile`` rewrites a ``torch.distributed`` collective into a traceable functional one
only when the callee is a key of ``_functional_collectives.traceable_collective_remaps``
(otherwise ``fullgraph=True`` fails, and without it the function silently runs eagerly). The
table holds torch's originals, so each wrapper of one of them is added under the same remap.
Importing that module costs about 12 ms, so at start-up the registration waits until something
imports it (Dynamo does, the first time it meets a collective); an explicit patch registers at
once.
"""

from __future__ import annotations

import sys
from typing import Any

from . import patchset

MODULE = "torch.distributed._functional_collectives"


def _table() -> dict[Any, Any] | None:
    module = sys.modules.get(MODULE)
    table = getattr(module, "traceable_collective_remaps", None)
    return table if isinstance(table, dict) else None


def register(patch: patchset.PatchSet | None = None, *, load: bool = True) -> int:
    """Add our wrappers to the remap table; returns how many entries were added.

    With ``load=False`` nothing is imported: 0 when the module is not loaded yet.
    """
    patch = patch or patchset.current()
    if patch is None:
        return 0
    if load and MODULE not in sys.modules:
        __import__(MODULE)
    table = _table()
    if table is None:
        return 0
    added = 0
    for name in patch.installed:
        original = patch.originals[name]
        remap = table.get(original)
        if remap is None:
            continue
        for wrapper in (patch.wrappers[name], patch.c10d.get(name)):
            if wrapper is not None and table.get(wrapper) is not remap:
                table[wrapper] = remap
                added += 1
    return added


def report() -> dict[str, list[str]]:
    """Which remappable collectives Dynamo knows under our wrappers, and which it does not."""
    patch = patchset.current()
    table = _table()
    out: dict[str, list[str]] = {"registered": [], "missing": []}
    if patch is None or table is None:
        return out
    for name in sorted(patch.installed):
        # Imported after the patch, the table was built from our wrappers (its keys come from
        # distributed_c10d, which holds them); imported before, from torch's originals.
        if patch.wrappers[name] in table or patch.c10d.get(name) in table:
            out["registered"].append(name)
        elif patch.originals[name] in table:
            out["missing"].append(name)
    return out
