"""The package as this checkout has it.

Ranks that check they import the package from this tree, not from an editable install of
another one (run the suite with this tree first on ``PYTHONPATH``), and interpreters and the
package's command line started with this tree first on the path and none of the package's
variables set.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.support import ROOT
from tests.support.ranks import Rank

TIMEOUT = timedelta(seconds=30)


def package() -> Any:
    """The package, checked to be this tree's (not an editable install of another one)."""
    import reloadpg_autopatch

    where = Path(reloadpg_autopatch.__file__).resolve()
    assert where.is_relative_to(ROOT), (
        f"the rank imported reloadpg_autopatch from {where}, not from {ROOT}: run the tests "
        f"with PYTHONPATH={ROOT}"
    )
    return reloadpg_autopatch


def begin(ctx: Rank, *, world: bool = False, gate: bool = True) -> tuple[Any, Any]:
    """A gate-patched rank on gloo, every group reloadable; WORLD registered and swapped."""
    rpg = package()
    return rpg, ctx.begin(gate=gate, world=world, timeout=TIMEOUT.total_seconds())


def env(**extra: str) -> dict[str, str]:
    """This environment without any of the package's variables, this tree first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLIME_RELOADABLE_PG")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env


def python(code: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(ROOT),
    )


def cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reloadpg_autopatch", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(ROOT),
    )
