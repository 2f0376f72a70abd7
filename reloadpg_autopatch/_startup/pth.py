"""The ``reloadpg_autopatch.pth`` line and the ``.start`` entry point, kept as ordinary code.

site.py executes a ``.pth`` line only if it starts with ``import`` and runs the whole line at
once, so a ``try`` statement cannot be written on it. The line therefore reads the gate itself
(importing nothing of ours while it is off) and otherwise executes, in a fresh namespace, the
body of ``guarded_activation`` below, its comments left out (not a second time: a venv
processes the file twice, and the line stops before compiling it; every start compiles the
line, so it is kept short: about 0.1 ms a compile). ``render_pth()`` builds that
line from this file, so the guard is linted like any other code; ``tests/unit/test_pth.py`` checks
that the files at the repository root are exactly what this module renders, and
``python -m reloadpg_autopatch._startup.pth [DIR]`` rewrites them.
"""

from __future__ import annotations

import inspect
import sys
import textwrap
from pathlib import Path

from .._env import GATE, OFF_VALUES

PTH_NAME = "reloadpg_autopatch.pth"
START_NAME = "reloadpg_autopatch.start"
ENTRY_POINT = "_reloadpg_autopatch_boot:activate_from_site"
#: Set on ``sys`` once the line has run: a venv processes the file twice (cpython#75723), and
#: the second time the line stops before compiling the guard (about 0.1 ms).
RAN = "_reloadpg_autopatch_pth_ran"


def guarded_activation() -> None:
    import sys

    # A venv may process this file twice (cpython#75723): the line acts, and complains, once.
    sys._reloadpg_autopatch_pth_ran = True
    try:
        from _reloadpg_autopatch_boot import activate_from_site

        activate_from_site()
    except BaseException as error:
        sys.stderr.write(f"reloadpg_autopatch: not activated ({type(error).__name__}: {error})\n")


def _guard_source() -> str:
    """The body of ``guarded_activation`` at module level, without its comments."""
    lines = inspect.getsource(guarded_activation).splitlines()[1:]
    kept = [line for line in lines if line.strip() and not line.strip().startswith("#")]
    return textwrap.dedent("\n".join(kept)) + "\n"


def render_pth() -> str:
    """The exact content of ``reloadpg_autopatch.pth``: one line."""
    return (
        f"import os, sys; os.environ.get({GATE!r}, '').strip().lower() in {OFF_VALUES!r} "
        f"or getattr(sys, {RAN!r}, False) or exec({_guard_source()!r}, {{}})\n"
    )


def render_start() -> str:
    """The exact content of ``reloadpg_autopatch.start`` (PEP 829, Python 3.15+)."""
    return ENTRY_POINT + "\n"


def write(directory: Path) -> list[Path]:
    """Write both files into ``directory``; return their paths."""
    written = []
    for name, text in ((PTH_NAME, render_pth()), (START_NAME, render_start())):
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    write(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
