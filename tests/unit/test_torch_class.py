"""``groups.torch_class``: what the patching layer registers to teach torch's class is given
once the lifecycle first hands out torch's own group object, whichever comes first.

The oracle is a list the lessons append to; no torch class is touched here (the rank test
``test_copying_a_group_gives_the_group_in_every_mode`` checks the real lesson, copying).
"""

from __future__ import annotations

import pytest

from reloadpg_autopatch.groups import torch_class


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's lessons and hand-out, as in a process that has neither yet."""
    monkeypatch.setattr(torch_class, "_LESSONS", [])
    monkeypatch.setattr(torch_class, "_HANDED", [False])


@pytest.mark.usefixtures("fresh")
def test_a_lesson_is_given_at_the_first_hand_out_or_at_once_if_it_came_first() -> None:
    given: list[str] = []

    def early() -> None:
        given.append("early")

    torch_class.when_handed(early)
    torch_class.when_handed(early)  # the patch applied twice registers it once
    assert given == []  # nothing handed out yet: torch's class stays as torch made it
    torch_class.handed()
    assert given == ["early"]
    torch_class.when_handed(lambda: given.append("late"))  # registered after the hand-out
    assert given == ["early", "late"]
    torch_class.handed()  # each later hand-out gives them again (each lesson is idempotent)
    assert given == ["early", "late", "early", "late"]
