"""What became of each framework lifecycle module handed to the adoption in this process, and
what the doctor shows of it (``status``)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import _env
from .switch import modules, setting


@dataclass
class Adoption:
    """What became of one framework lifecycle module in this process."""

    module: str
    #: The names now pointing at this package's lifecycle (empty when kept).
    adopted: tuple[str, ...] = ()
    #: Why the framework's own lifecycle stays, or None when adopted.
    kept: str | None = None
    #: ``module.attribute`` bindings elsewhere, made before adoption, pointed at ours too.
    rebound: list[str] = field(default_factory=list)
    #: The framework's ``monkey_patch_torch_dist`` refuses its destroyed groups (kept only).
    guarded: bool = False
    #: What adoption kept of the framework's patch besides its lifecycle (adopted only).
    kept_jobs: list[str] = field(default_factory=list)


#: Module name -> (the module object, what was done, ``{name: what was put there}``): a module
#: imported again, or executed again in place, is handled again (``handling``).
SEEN: dict[str, tuple[Any, Adoption, dict[str, Any]]] = {}


def status() -> dict[str, Any]:
    """The switch, the modules watched, and what became of each one imported here."""
    on, problem = setting()
    return {
        "variable": os.environ.get(_env.ADOPT_ENV),
        "on": on,
        "problem": problem,
        "modules": list(modules()),
        "seen": [
            {**asdict(adoption), "adopted": list(adoption.adopted)}
            for _, adoption, _ in SEEN.values()
        ],
    }
