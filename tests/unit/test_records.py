"""The record state machine: every allowed move works, every other move is refused.

The table under test is spelled out here again, from the lifecycle's promises, so a change to
``TRANSITIONS`` that the lifecycle did not ask for fails.
"""

from __future__ import annotations

import itertools

import pytest

from reloadpg_autopatch.groups.record import TRANSITIONS, Record, State, TransitionError

L, D, N, R, E = State.LIVE, State.DESTROYED, State.NON_MEMBER, State.RELEASED, State.ENDED
S, B = State.SUSPENDED, State.BROKEN

ALLOWED = {
    (L, D),  # destroy_process_groups() frees it
    (D, L),  # reload_process_groups() rebuilds it
    (L, R),  # the program releases or drops it
    (D, R),  # ... also while it is destroyed
    (L, E),  # its world is destroyed
    (D, E),
    (N, E),  # no member needs it any more, or its world is destroyed
    (R, E),  # no rank needs it any more, or its world is destroyed
    # Suspend mode: the communicator sleeps in place and wakes; one that fails half-way is
    # broken for good.
    (L, S),  # destroy_process_groups() suspends it (or only guards it)
    (S, L),  # reload_process_groups() resumes it
    (S, R),  # released once the reload resumed it with its peers
    (S, E),  # its world is destroyed
    (S, B),  # a suspend or a resume failed half-way
    (B, R),  # the program lets go of a broken group
    (B, E),  # its world is destroyed
    # NCCL 2.31's destroy waits for every member: a free that outlived its deadline was
    # aborted, and so were the frees after it (issue 36).
    (L, B),  # its free was stuck (aborted), or a free before it was (aborted instead)
    (D, B),  # freed, by an abort, after a stuck free
}


def test_the_table_is_the_lifecycles() -> None:
    table = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    assert table == ALLOWED
    assert set(TRANSITIONS) == set(State)


@pytest.mark.parametrize(("start", "end"), sorted(ALLOWED, key=str))
def test_allowed_moves(start: State, end: State) -> None:
    record = Record((), {"ranks": [0, 1]}, "7", start)
    record.move(end)
    assert record.state is end


@pytest.mark.parametrize(
    ("start", "end"),
    sorted(set(itertools.product(State, State)) - ALLOWED, key=str),
)
def test_every_other_move_is_refused(start: State, end: State) -> None:
    record = Record((), {}, "7", start)
    with pytest.raises(TransitionError, match=f"from {start.value} to {end.value}"):
        record.move(end)
    assert record.state is start


def test_records_copy_the_callers_lists() -> None:
    ranks = [0, 1]
    record = Record((ranks,), {"ranks": ranks}, "3", State.LIVE)
    ranks.append(2)  # the caller reuses its list for the next group
    assert record.args == ([0, 1],)
    assert record.kwargs == {"ranks": [0, 1]}
