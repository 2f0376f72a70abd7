"""The doctor and the demo in a venv that has the wheel but no torch: a clear answer, no traceback.

The venv never sees this environment's packages, so these run the same in every lane; in the
start-up lane they run on Python 3.10, 3.12 and 3.13 too. Nothing in that venv but us writes to
stderr, so stderr is checked whole.
"""

from __future__ import annotations

import json

import pytest

from tests.support.venv import clean_env

pytestmark = [pytest.mark.startup, pytest.mark.timeout(300)]


def cli(venv, *args: str, **env: str | None):
    return venv.run("-m", "reloadpg_autopatch", *args, env=clean_env(**env))


def test_doctor_gate_off_is_healthy_and_says_torch_is_absent(installed_without_torch) -> None:
    venv = installed_without_torch
    proc = cli(venv, "doctor")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert "  site         processing on; site-packages: " in proc.stdout
    pth = venv.purelib / "reloadpg_autopatch.pth"
    assert f"  .pth         installed: {pth} (current)" in lines
    assert "  gate         SLIME_RELOADABLE_PG=None -> off" in lines
    assert "  torch        not installed in this interpreter: nothing to patch" in lines
    assert not [line for line in lines if "PROBLEM" in line]
    assert lines[-1] == "verdict: healthy, inactive (gate off)"

    report = json.loads(cli(venv, "doctor", "--json", SLIME_RELOADABLE_PG="off").stdout)
    assert report["verdict"] == "healthy, inactive (gate off)"
    assert report["torch"] == {"version": None, "patched": False, "installed": False}
    assert report["gate"]["verdict"] == "off"
    assert report["pth"]["installed"]
    assert report["pth"]["current"]
    assert report["start"]["installed"]
    assert report["problems"] == []


def test_doctor_gate_on_exits_one_and_says_why(installed_without_torch) -> None:
    venv = installed_without_torch
    proc = cli(venv, "doctor", SLIME_RELOADABLE_PG="1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr == ""  # the .pth ran, installed its hook and said nothing
    problems = [line for line in proc.stdout.splitlines() if "PROBLEM" in line]
    assert len(problems) == 1, proc.stdout
    assert "the gate is on (SLIME_RELOADABLE_PG='1') but torch is not importable" in problems[0]
    assert str(venv.python) in problems[0]
    assert "  gate         SLIME_RELOADABLE_PG='1' -> on" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "verdict: problems found"

    report = json.loads(cli(venv, "doctor", "--json", SLIME_RELOADABLE_PG="1").stdout)
    assert report["torch"]["installed"] is False
    assert report["activation"]["activated"] is True  # the hook waits for a torch that never comes
    assert report["activation"]["source"] == "site"


@pytest.mark.parametrize("gate", [None, "1"])
def test_demo_says_torch_is_missing_in_one_line(installed_without_torch, gate) -> None:
    proc = cli(installed_without_torch, "demo", "--world-size", "2", SLIME_RELOADABLE_PG=gate)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "python -m reloadpg_autopatch demo: error: torch is not installed in this interpreter "
        f"({installed_without_torch.python}); install torch into this environment to run the demo"
    ]


def test_bad_demo_arguments_are_still_usage_errors(installed_without_torch) -> None:
    proc = cli(installed_without_torch, "demo", "--world-size", "0")
    assert proc.returncode == 2
    assert "--world-size must be at least 1" in proc.stderr
