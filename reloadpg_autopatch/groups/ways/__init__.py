"""The ways a group sleeps and wakes; the choice of a group's way is in ``catalog``.

This package's names (``choose``, ``register``, ``MODES``, ``SUSPEND``...) are ``catalog``'s,
loaded on first use (PEP 562); ``lifecycle_only`` answers wrapper mode itself. The patch, which
runs the moment ``torch.distributed`` is imported, needs the wrapper's class alone
(``wrapper.group``), and loading every way, its answers, rounds and reports there cost more
than half of the patch (about 20 ms here).
"""

from __future__ import annotations

import importlib
from typing import Any


def lifecycle_only() -> bool:
    """``catalog.lifecycle_only``, answered without loading the catalog in wrapper mode, which
    wraps every group (a built-in mode's ways are fixed: ``register`` refuses its name): the
    patch asks this the moment torch.distributed is imported."""
    from .. import mode

    if mode.get_reload_mode() == "wrapper":
        return False
    return importlib.import_module(f"{__name__}.catalog").lifecycle_only()


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    catalog = importlib.import_module(f"{__name__}.catalog")
    try:
        value = getattr(catalog, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value  # later lookups, and a test's monkeypatch, find it here
    return value
