"""The choice of a way is written once (``groups/ways``): the patch installer and the doctor ask
it rather than deciding alone. Each is given a choice that only a spy could make, and must
answer with it."""

from __future__ import annotations

from typing import Any

import pytest

from reloadpg_autopatch.groups import ways
from reloadpg_autopatch.patching import install


@pytest.mark.parametrize("answer", [True, False])
def test_the_patch_installer_asks_the_ways(monkeypatch: Any, answer: bool) -> None:
    asked = []
    monkeypatch.setattr(ways, "lifecycle_only", lambda: asked.append(1) or answer)
    assert install.lifecycle_only() is answer
    assert asked == [1]


def test_the_doctor_asks_the_ways_and_reports_their_problem(monkeypatch: Any) -> None:
    asked = []

    def explain(group: Any, backend: str) -> tuple[str, str | None]:
        asked.append((group, backend))
        return "a spy's action", "a spy's problem"

    from reloadpg_autopatch.groups import lifecycle
    from reloadpg_autopatch.tools.doctor import Report, gather

    class Group:
        """A group torch does not know, of a backend that says its name."""

        def _get_backend_name(self) -> str:
            return "spy"

    group = Group()
    monkeypatch.setattr(ways, "explain", explain)
    monkeypatch.setattr(lifecycle, "reloadable_groups", lambda: [group])
    report = Report()
    gather.ways(report)
    assert report.fidelity["mode"]["backends"]["spy"] == "a spy's action"
    assert asked[-1] == (group, "spy")  # after WORLD, where an earlier test left one
    assert report.problems == ["a spy's problem"] * len(asked)


@pytest.mark.parametrize("mode", ["wrapper", "native", "suspend", "auto"])
def test_no_wrapper_is_installed_only_where_no_group_can_need_one(
    monkeypatch: Any, mode: str
) -> None:
    """As documented: native mode on a torch that reconfigures in place, suspend mode on one
    whose pre-hooks guard torch's own groups; never wrapper or auto (a wrapper may be chosen)."""
    from reloadpg_autopatch.groups import mode as modes
    from reloadpg_autopatch.groups.ways import inplace, suspend

    monkeypatch.setattr(modes, "get_reload_mode", lambda: mode)
    expected = {
        "wrapper": False,
        "auto": False,
        "native": inplace.torch_can_reconfigure(),
        "suspend": suspend.torch_can_suspend() and suspend.torch_has_pre_hooks(),
    }[mode]
    assert ways.lifecycle_only() is expected
