"""Behind a wrapper: the way (``way``), the wrapper class (``group``), its forwarders, and the
one place that serves a wrapper with a native group or takes it away (``binding``)."""

from .group import ReloadableProcessGroup
from .way import WRAPPER, Wrapper

__all__ = ["WRAPPER", "ReloadableProcessGroup", "Wrapper"]
