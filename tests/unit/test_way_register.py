"""``ways.register`` refuses a way whose decisions can give a step it has no method for.

Without the check, such a way would fail half-way through a cycle, after every rank agreed on
the step: the rank that cannot carry it out raises, its peers wait for it. The oracle is the
way's own decisions, written here: what each returns is what it must carry out.
"""

from __future__ import annotations

from typing import ClassVar

import pytest

from reloadpg_autopatch.groups import ways
from reloadpg_autopatch.groups.decisions import DestroyFacts, DestroyStep, ReloadFacts, ReloadStep
from reloadpg_autopatch.groups.ways import catalog


class _FreesButCannot(ways.Way):
    """Frees a live group at a destroy (and recreates it at a reload), with no ``free``."""

    name: ClassVar[str] = "frees without free"

    def sleep_step(self, facts: DestroyFacts) -> DestroyStep:
        return DestroyStep.FREE_WRAPPED

    def recreate(self, record, run) -> None:
        pass

    def release_abandoned(self, record, run) -> None:
        pass

    def recreate_after_restore(self, record, run) -> None:
        pass


class _Whole(_FreesButCannot):
    name: ClassVar[str] = "frees, whole"

    def free(self, record, run) -> None:
        pass


class _RebuildsWithoutRebuild(_Whole):
    name: ClassVar[str] = "rebuilds without rebuild"

    def wake_step(self, facts: ReloadFacts) -> ReloadStep:
        return ReloadStep.REBUILD_IN_PLACE


@pytest.fixture(autouse=True)
def _registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a test registers is gone after it."""
    monkeypatch.setattr(catalog, "_REGISTERED", list(catalog._REGISTERED))


def test_a_way_missing_the_method_of_a_step_it_gives_is_refused() -> None:
    with pytest.raises(TypeError, match=r"free wrapped \(free\)"):
        ways.register(_FreesButCannot())
    with pytest.raises(TypeError, match=r"rebuild in place \(rebuild\)"):
        ways.register(_RebuildsWithoutRebuild())
    assert not any(type(w) in (_FreesButCannot, _RebuildsWithoutRebuild) for w in ways.registered())


def test_a_whole_way_is_registered_and_every_built_in_way_is_whole() -> None:
    whole = _Whole()
    assert ways.register(whole) is whole
    assert whole in ways.registered()
    for way in ways.registered():
        assert ways.missing_steps(way) == [], way


def test_a_way_deciding_by_the_suspend_verdicts_is_checked_for_every_one() -> None:
    """A suspend way's steps come from the destroy's agreement (its verdict): the check tries
    every verdict, so a suspend way without ``suspend`` or ``guard`` is refused too."""
    from reloadpg_autopatch.groups.ways.base.steps import Steps
    from reloadpg_autopatch.groups.ways.suspend.way import Suspend

    class _SleepsWithoutSuspend(Suspend):
        name: ClassVar[str] = "suspends without suspend"
        suspend = Steps.suspend

    class _GuardsWithoutGuard(Suspend):
        name: ClassVar[str] = "guards without guard"
        guard = Steps.guard

    with pytest.raises(TypeError, match=r"suspend \(suspend\)"):
        ways.register(_SleepsWithoutSuspend())
    with pytest.raises(TypeError, match=r"guard \(guard\)"):
        ways.register(_GuardsWithoutGuard())


@pytest.mark.parametrize("name", ["wrapper", "Suspend", "auto", "native"])
def test_a_built_in_mode_is_not_taken_over_by_a_registered_way(name: str) -> None:
    """A plugin naming its mode like a built-in one would change what every program choosing
    that mode gets, silently (the patch also answers wrapper mode without asking the ways)."""
    whole = _Whole()
    with pytest.raises(ValueError, match=r"built-in mode.*wrapper, native, suspend, auto"):
        ways.register(whole, mode=name)
    assert whole not in ways.registered()
    assert [get() for get in ways.MODES["wrapper"]] == [ways.WRAPPER]
