"""``python -m reloadpg_autopatch doctor``: say exactly what is and is not patched, and why.

Every check is a fact of *this* interpreter (its site-packages, its flags, its environment),
so run the doctor with the same Python and the same variables as the training process, for
example inside the Ray ``runtime_env`` or the training image. In a training process,
``diagnose()`` reports on its live groups too.

Each room of the package reports facts about itself (``_startup.facts``, ``patching.facts``,
``adoption.facts``, ``groups.facts``, ``groups.world.facts``,
``groups.ways.suspend.facts``; the NCCL implementations in ``implementations``); ``gather``
asks them in order and collects their problems into one ``Report`` (``report``, which also
holds the verdict and the exit code); ``renderer`` is the one renderer, text or JSON; ``cli``
is the command.
"""

from __future__ import annotations

from .gather import diagnose
from .renderer import as_json, render
from .report import Report

__all__ = ["Report", "as_json", "diagnose", "render"]
