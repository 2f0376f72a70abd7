"""The failure that started the project, reproduced on Megatron's real bindings."""

from __future__ import annotations

import pytest

from reloadpg_autopatch.tools import launch
from tests.support import PROGRAMS
from tests.support.venv import clean_env

pytestmark = pytest.mark.timeout(300)

PROGRAM = PROGRAMS / "seed_scenario.py"


def _run(installed, mode: str, gate: str | None) -> list[dict]:
    outcomes = launch.launch(
        [str(installed.python), str(PROGRAM), "--mode", mode],
        2,
        env=clean_env(SLIME_RELOADABLE_PG=gate),
        timeout=240,
    )
    return [next(e for e in o.events if e["type"] == "result") for o in outcomes]


def test_without_the_package_megatrons_binding_fails(installed) -> None:
    for result in _run(installed, "plain", None):
        assert result["group"] == "SlimeLikeGroup"
        assert not result["binding_is_ours"]
        assert "No backend type associated with device type cpu" in result["error"]


@pytest.mark.parametrize(("mode", "gate"), [("gate", "1"), ("late", None)])
def test_with_the_package_it_works_early_and_late(installed, mode, gate) -> None:
    """About 10 s: fresh interpreters from the installed wheel import torch and megatron-core,
    which is the scenario (the upstream report's late patch)."""
    for result in _run(installed, mode, gate):
        assert result["error"] is None
        assert result["gathered"] == [0.0, 0.0, 1.0, 1.0]
        assert result["binding_is_ours"]  # early: bound at import; late: rebound by the sweep
