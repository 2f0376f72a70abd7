"""The interface of a way: how a group sleeps and wakes, and how it says so.

A record's way answers every question destroy and reload ask about the record, so the drivers
never look at which way it is. Its jobs, one module each:

- ``choosing``: whether it can take a group, and why not (``ways.choose`` asks; the doctor too);
- ``deciding``: which step a destroy or a reload takes with a record (pure, from the record's
  facts and what the ranks agreed: tested over every input in one process);
- ``answering``: what this rank says about the record in each step's agreement;
- ``steps``: how each step is carried out, a method per step that the drivers call directly
  (``destroy._carry_out``, ``reload._carry_out``); ``ways.register`` checks that a way has the
  method of every step its decisions can give;
- ``appearance``: how the group appears (the object held, its label, its report, the error of a
  use while it has no native group).

A way is one object; ``ways.register`` makes it known. Adding one is one module.
"""

from __future__ import annotations

from .answering import KEPT, Answering
from .appearance import Appearance
from .choosing import Choosing
from .deciding import Deciding
from .steps import Steps, missing_steps


class Way(Choosing, Deciding, Answering, Steps, Appearance):
    """One way a group sleeps and wakes. Subclasses set the flags and fill in the steps."""

    def __repr__(self) -> str:
        return f"<way {self.name}>"


__all__ = ["KEPT", "Way", "missing_steps"]
