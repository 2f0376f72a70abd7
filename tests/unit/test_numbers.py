"""Every number a variable or an API takes is finite and in range, or refused naming the
argument and what is accepted (issue 38, item 4).

The oracle is the exception each call raises (its type, the argument it names) and what the
setting reads back afterwards. The start-up line for a bad value is checked on a fresh
interpreter's stderr in ``tests/ranks/test_variables.py``.
"""

from __future__ import annotations

import math

import pytest

from reloadpg_autopatch import _env

#: Numbers no threshold of GiB may be: they overflow the conversion to bytes, or name no amount.
NOT_GIB = ["inf", "-inf", "1e999", "-1e999", "nan", "-1", "1048577", "1e300", "lots", ""]


@pytest.mark.startup
@pytest.mark.parametrize("raw", NOT_GIB)
def test_a_min_free_gb_that_is_not_a_finite_amount_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="SLIME_RELOADABLE_PG_MIN_FREE_GB=") as caught:
        _env.parse_min_free_gb(raw)
    assert "accepted: 0" in str(caught.value)
    assert "up to 1048576" in str(caught.value)


@pytest.mark.startup
@pytest.mark.parametrize("raw", ["0", "3", " 1.5 ", "1048576", "1e-3"])
def test_a_finite_min_free_gb_in_range_is_taken_as_given(raw: str) -> None:
    value = _env.parse_min_free_gb(raw)
    assert value == float(raw)
    assert math.isfinite(value)
    assert _env.min_free_problem(raw) is None


@pytest.mark.parametrize(
    "value", [float("inf"), float("-inf"), float("nan"), 1e999, -1.0, 2.0**20 + 1, 1e300]
)
def test_set_memory_guard_refuses_what_is_not_a_finite_amount(value: float) -> None:
    from reloadpg_autopatch.groups import guard

    before = guard.get_memory_guard()
    with pytest.raises(ValueError, match="min_free_gb") as caught:
        guard.set_memory_guard(value)
    assert "finite" in str(caught.value)
    assert guard.get_memory_guard() == before  # nothing changed


def test_set_memory_guard_takes_the_largest_amount_and_refuses_a_string() -> None:
    from reloadpg_autopatch.groups import guard, settings

    held = settings.current()
    saved = held.guard
    try:
        guard.set_memory_guard(float(2**20))
        assert guard.get_memory_guard().min_free_gb == 2.0**20
        with pytest.raises(TypeError, match="min_free_gb"):
            guard.set_memory_guard("3")  # type: ignore[arg-type]
    finally:
        held.guard = saved


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "0", "-3"])
def test_the_demos_timeout_must_be_a_positive_finite_number(
    raw: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from reloadpg_autopatch.__main__ import main

    with pytest.raises(SystemExit) as caught:
        main(["demo", f"--timeout={raw}"])
    assert caught.value.code == 2
    assert "--timeout must be a positive, finite number of seconds" in capsys.readouterr().err
