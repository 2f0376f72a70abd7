"""What the adoption knows about itself, for the doctor: for each framework's lifecycle module
imported here, adopted (its names call the package's) or its own, and why; which modules bind
the lifecycle names, and to whose; and a mode that would never run because a framework keeps
its own lifecycle.

Without the patch (or without torch) it says only which watched modules are imported: it
imports the lifecycle only where the patch ran.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from .. import _env


def facts(patched: bool) -> tuple[dict[str, Any], list[str]]:
    """The switch, the modules watched, what became of each one imported here and who holds
    the lifecycle names; a problem for each framework keeping its own lifecycle while a mode
    other than ``wrapper`` is chosen."""
    from .seen import status

    found: dict[str, Any] = {**status(), "callers": {}}
    loaded = [name for name in found["modules"] if name in sys.modules]
    if not patched:
        found["seen"] = [
            {"module": name, "adopted": [], "kept": "torch.distributed is not patched here"}
            for name in loaded
        ]
        return found, []
    from ..groups import mode

    seen = {entry["module"] for entry in found["seen"]}
    for name in loaded:
        if name not in seen:
            found["seen"].append(
                {"module": name, "adopted": [], "kept": "not handed to the adoption yet"}
            )
    found["callers"] = callers(seen)
    chosen = mode.get_reload_mode()
    if chosen == "wrapper":
        return found, []
    return found, [
        f"{_env.MODE_ENV}={chosen} is chosen, but {entry['module']} keeps its own "
        f"lifecycle ({entry['kept']}): its destroy_process_groups() and "
        f"reload_process_groups() never reach this package, so the {chosen} mode would "
        f"never run; let the package adopt it (unset {_env.ADOPT_ENV}) or use wrapper"
        for entry in found["seen"]
        if entry["kept"]
    ]


def callers(frameworks: set[str]) -> dict[str, dict[str, str]]:
    """Modules that hold a lifecycle name, and whose function each one is (ours or a
    framework's): the names an actor bound at import decide where its calls go."""
    from .adopted import ours as adopted

    ours = {id(f): f for f in adopted().values()}
    out: dict[str, dict[str, str]] = {}
    for module_name, module in list(sys.modules.items()):
        if module_name.split(".", 1)[0] in ("reloadpg_autopatch", "torch"):
            continue
        namespace = getattr(module, "__dict__", None)
        if type(namespace) is not dict:
            continue
        for name in _env.ADOPTED_NAMES:
            value = namespace.get(name)
            if value is None or not callable(value):
                continue
            home = getattr(value, "__module__", None)
            try:
                inner = inspect.unwrap(value)
            except ValueError:
                inner = value
            if ours.get(id(value)) is value or ours.get(id(inner)) is inner:
                out.setdefault(module_name, {})[name] = "reloadpg_autopatch"
            elif home in frameworks:
                out.setdefault(module_name, {})[name] = str(home)
    return out
