"""Framework-shaped packages for the adoption tests (issue 29), written for this project.

Each reproduces, from the research notes on the frameworks' public source (no code of theirs),
the surface an unmodified actor relies on: ``slime``, ``miles`` and ``miles_plugins`` here are
importable packages once ``ROOT`` is on ``sys.path`` (``tests/support/frameworks`` itself, not
the repository root: the packages must be importable under the frameworks' own names, which the
package adopts by name). ``forkrl`` is a fork's lifecycle module under a name of its own, which
only ``SLIME_RELOADABLE_PG_ADOPT_MODULES`` makes the package adopt.

What each module keeps from its framework, and what it leaves out, is in its docstring.
"""

from pathlib import Path

#: The folder to put on ``sys.path`` so that ``import slime`` finds the fixture.
ROOT = Path(__file__).resolve().parent


def on_path() -> None:
    """Make the framework-shaped packages importable in this process (a rank)."""
    import sys

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
