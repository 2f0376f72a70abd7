"""Behind a wrapper: the way (``way``), the wrapper class (``group``), its forwarders, and the
one place that serves a wrapper with a native group or takes it away (``binding``).

The class is loaded with the package (the patch needs it); the way, which brings the lifecycle's
answers and rounds, on first use (PEP 562).
"""

from typing import Any

from .group import ReloadableProcessGroup

__all__ = ["WRAPPER", "ReloadableProcessGroup", "Wrapper"]


def __getattr__(name: str) -> Any:
    if name in ("WRAPPER", "Wrapper"):
        from . import way

        return getattr(way, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
