"""The adoption switch's vocabulary (``_env``): ``SLIME_RELOADABLE_PG_ADOPT`` and the modules."""

from __future__ import annotations

import pytest

from reloadpg_autopatch import _env
from reloadpg_autopatch._startup import problems as startup_problems

pytestmark = pytest.mark.startup


@pytest.mark.parametrize(
    ("raw", "adopt"),
    [
        *[(None, True), ("", True), ("  ", True), ("1", True), (" On ", True), ("YES", True)],
        *[("0", False), ("false", False), (" No", False), ("OFF\t", False)],
    ],
)
def test_adoption_is_on_by_default_and_off_values_keep_the_frameworks_own(raw, adopt) -> None:
    assert _env.parse_adopt(raw) is adopt


@pytest.mark.parametrize("raw", ["maybe", "2", "1; import os", "x" * 500])
def test_a_bad_value_is_one_line_naming_the_variable_and_the_accepted_values(raw) -> None:
    with pytest.raises(ValueError, match="SLIME_RELOADABLE_PG_ADOPT=") as caught:
        _env.parse_adopt(raw)
    text = str(caught.value)
    assert "\n" not in text
    assert "1, true, yes, on" in text
    assert "0, false, no, off" in text
    assert len(text) < 400  # a long value is cut (excerpt), not echoed whole


def test_the_frameworks_modules_are_adopted_and_the_variable_adds_more() -> None:
    modules, problems = _env.parse_adopt_modules(None)
    assert modules == (
        "slime.utils.reloadable_process_group",
        "miles.utils.reloadable_process_group",
        "vime.utils.reloadable_process_group",
    )
    assert problems == []
    modules, problems = _env.parse_adopt_modules(" forkrl.lifecycle, ,bad name,slime.utils.x ")
    assert modules[3:] == ("forkrl.lifecycle", "slime.utils.x")
    assert len(problems) == 1
    assert "'bad name'" in problems[0]
    assert _env.ADOPT_ENV in _env.VARIABLES
    assert _env.ADOPT_MODULES_ENV in _env.VARIABLES


def test_start_up_reports_each_bad_adoption_value(monkeypatch) -> None:
    monkeypatch.setenv(_env.ADOPT_ENV, "maybe")
    monkeypatch.setenv(_env.ADOPT_MODULES_ENV, "ok.name,no good")
    problems = startup_problems.adoption_problems()
    assert len(problems) == 2
    assert "'maybe'" in problems[0]
    assert "'no good'" in problems[1]
    monkeypatch.delenv(_env.ADOPT_ENV)
    monkeypatch.delenv(_env.ADOPT_MODULES_ENV)
    assert startup_problems.adoption_problems() == []


def test_the_doctor_reports_bad_values_and_a_framework_module_left_unpatched(monkeypatch) -> None:
    """Without the patch (no torch needed): a bad switch value is a problem, and a framework's
    lifecycle module imported here is listed as keeping its own lifecycle, and why."""
    import sys
    import types

    from reloadpg_autopatch.tools.doctor import Report, gather, renderer

    monkeypatch.setenv(_env.ADOPT_ENV, "maybe")
    name = "slime.utils.reloadable_process_group"
    monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    report = Report()
    gather.adoption(report)
    assert any("'maybe'" in p for p in report.problems), report.problems
    assert report.adoption["seen"] == [
        {"module": name, "adopted": [], "kept": "torch.distributed is not patched here"}
    ]
    text = "\n".join(renderer.adoption(report))
    assert f"{_env.ADOPT_ENV}='maybe' -> not understood, so off" in text, text
    assert f"{name}: its own lifecycle (torch.distributed is not patched here)" in text, text
