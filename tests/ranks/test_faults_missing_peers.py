"""A peer that died, froze or was interrupted: named when it is missing, never blamed when it
is there (issue 38, items 5 and 6; issue 15).

A round whose peer died names it; a rank later than WORLD's timeout is refused like the others;
a frozen peer, and a retry after an interrupt, blame no rank that is there; a rank that dies in
any step of a reload (or the store's host) fails the others within WORLD's timeout, naming the
step, the cycle and the missing rank. Every free waits for its members there, as NCCL 2.31's
destroy does (``tests/support/destroy_barrier.py``).

Every rank is a real gloo rank activated by the gate, on the launcher's TCPStore (or rank 0's,
where the host's exit is the subject). The faults are real process events: a rank ends itself
with ``os._exit`` or stops itself with ``SIGSTOP`` at a chosen point of a step, and a
``KeyboardInterrupt`` is raised where a ``SIGINT`` lands, in the rank's wait for a round's
result. Where the point is inside the store protocol, the rank reaches it through a store of
its own that forwards to torch's (``tests/support/stores.py``) and acts at one call, because no
timer lands between two store calls reliably.

The oracles are outside the package: which ranks the test killed, stopped or interrupted, the
clock against WORLD's timeout, and torch's collective results after a retry.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from datetime import timedelta
from typing import Any

import pytest

from tests.support import run_events
from tests.support.ranks import GATE, Rank, run_ranks, total

pytestmark = pytest.mark.timeout(180)

#: WORLD's timeout in these ranks.
WORLD_S = 3.0
#: What a survivor's error may take beyond WORLD's timeout: the round's end, every live rank's
#: mark (``stalled.GRACE_S``, 2 s), and the creation's grace (``faults.GRACE_S``, 3 s).
SLACK_S = 6.0


def _fault_store(ctx: Rank, act: Any) -> None:
    """This rank's rounds go through a forwarding store that calls ``act(method, key)`` first."""
    from reloadpg_autopatch.groups.store import channel
    from tests.support.stores import Forwarding

    real = channel.base_store

    class Faulty(Forwarding):
        def add(self, key: str, value: int) -> int:
            act("add", key)
            return self.inner.add(key, value)

        def wait(self, keys: Any, timeout: Any = None) -> Any:
            act("wait", keys[0])
            return super().wait(keys, timeout)

    channel.base_store = lambda: Faulty(real())


def _error(call: Any) -> dict[str, Any]:
    started = time.monotonic()
    try:
        call()
        out: dict[str, Any] = {"error": None}
    except Exception as error:
        out = {
            "error": type(error).__name__,
            "message": str(error),
            "missing": getattr(error, "missing", None),
        }
    out["seconds"] = time.monotonic() - started
    return out


# ---- item 5: a rank killed after appending its entry ------------------------------------------


#: How late rank 1 arrives at the destroy, in the ``late-survivor`` case: it is still waiting
#: when rank 0 times out, and would time out itself only after rank 0 has named the missing.
LATE_S = 2.5
#: How late rank 1 reads who marked itself alive, in the ``host-exits`` case.
SLOW_READ_S = 1.0


def _killed_in_the_destroys_agreement(ctx: Rank, dies: int, case: str) -> dict:
    """Rank ``dies`` ends its process after appending its entry to the destroy's agreement,
    before counting itself in. ``host-exits``: rank 0 hosts the store and ends its own process
    the moment its destroy raises, and rank 1 reads who is alive ``SLOW_READ_S`` late.
    ``late-survivor``: rank 1 arrives ``LATE_S`` after rank 0."""
    dist = ctx.begin(timeout=WORLD_S)
    group = dist.new_group(list(range(ctx.world_size)))
    # Every rank is done connecting the group's mesh before one dies: gloo's connectFullMesh on
    # a slow peer fails with "Connection closed by peer" where rank 2 ran ahead and died.
    dist.barrier()
    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.groups.store import entries

    if ctx.rank == dies:

        def act(method: str, key: str) -> None:
            if method == "add" and key.endswith("/0/agreement/count"):
                os._exit(0)

        _fault_store(ctx, act)
    if ctx.rank == 1 and case == "host-exits":
        read = entries.read

        def slow(store: Any, key: str) -> bytes:
            if key.endswith("/alive"):
                time.sleep(SLOW_READ_S)
            return read(store, key)

        entries.read = slow
    if ctx.rank == 1 and case == "late-survivor":
        time.sleep(LATE_S)
    host_exits = case == "host-exits"
    out = _error(rpg.destroy_process_groups)
    if host_exits and ctx.store_host:
        os._exit(0)  # as an uncaught exception ends it
    out["group"] = str(group.group_name)
    return out


@pytest.mark.parametrize("case", ["host-stays", "host-exits", "late-survivor"])
def test_a_rank_killed_after_appending_its_entry_is_named_by_every_survivor(case: str) -> None:
    """Rank 2 of 3 dies after appending its entry to the destroy's agreement: every survivor
    raises ``PeerMissingError`` with ``missing == [2]`` within WORLD's timeout and the slack
    (before: ``missing == []`` and "the store failed"). With the store's host (rank 0) exiting
    the moment it raised, rank 1, reading a second late, still names rank 2, not "its host
    left". A survivor that arrived 2.5 s after rank 0 is not named: rank 0's timeout ended the
    round for it too, and it said it was alive."""
    host_exits = case == "host-exits"
    body = functools.partial(_killed_in_the_destroys_agreement, dies=2, case=case)
    reports = run_ranks(
        body, 3, timeout=90, env=GATE, store_in_rank0=host_exits, may_die=frozenset({0, 2})
    )
    survivors = [1] if host_exits else [0, 1]
    for rank in survivors:
        out = reports[rank]
        assert out["error"] == "PeerMissingError", (rank, out)
        assert out["missing"] == [2], (rank, out)
        assert "ranks 2" in out["message"], (rank, out)
        assert "host" not in out["message"], (rank, out)
        assert out["seconds"] < WORLD_S + SLACK_S, (rank, out)


def _one_rank_later_than_worlds_timeout(ctx: Rank) -> dict:
    """Rank 2 arrives at the destroy ``WORLD_S + 0.5`` s after the others, alive."""
    dist = ctx.begin(timeout=WORLD_S)
    group = dist.new_group(list(range(ctx.world_size)))
    import reloadpg_autopatch as rpg

    if ctx.rank == 2:
        time.sleep(WORLD_S + 0.5)
    out = _error(rpg.destroy_process_groups)
    out["group"] = str(group.group_name)
    return out


def test_a_rank_later_than_worlds_timeout_is_refused_like_the_others() -> None:
    """Ranks 0 and 1 time out at the destroy's agreement before rank 2 arrives: rank 2, the
    last to count itself in, does not complete the round for itself alone (its peers have
    raised already): every rank raises ``PeerMissingError``."""
    reports = run_ranks(_one_rank_later_than_worlds_timeout, 3, timeout=90, env=GATE)
    assert [r["error"] for r in reports] == ["PeerMissingError"] * 3, reports


# ---- item 6: a rank frozen by SIGSTOP in a reload's creations ----------------------------------


def _frozen_after_its_first_creation(ctx: Rank, tmp: str) -> dict:
    """Groups [0, 1, 2], [0, 1], [0, 2]; in the reload, rank 1 stops itself (SIGSTOP) once it
    has created the first again. Rank 0 then fails at [0, 1], rank 2 at [0, 2], where rank 0
    does not come because it failed before; rank 0 ends rank 1 afterwards (SIGKILL)."""
    dist = ctx.begin(timeout=WORLD_S)
    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.groups import recreation

    groups = [dist.new_group([0, 1, 2]), dist.new_group([0, 1]), dist.new_group([0, 2])]
    rpg.destroy_process_groups()
    if ctx.rank == 1:
        with open(os.path.join(tmp, "rank1.pid"), "w") as pid:
            pid.write(str(os.getpid()))
        real = recreation.create_again

        def create_again(record: Any) -> Any:
            native = real(record)
            os.kill(os.getpid(), signal.SIGSTOP)
            return native

        recreation.create_again = create_again
    out = _error(rpg.reload_process_groups)
    if ctx.rank == 0:
        with open(os.path.join(tmp, "rank1.pid")) as pid:
            os.kill(int(pid.read()), signal.SIGKILL)
    out["groups"] = len(groups)
    return out


def test_a_frozen_rank_makes_no_survivor_name_a_rank_that_is_there(tmp_path) -> None:
    """Rank 1 of 3 freezes (SIGSTOP) in a reload; ranks 0 and 2 fail at different creations,
    both within WORLD's timeout and the slack, and neither names a rank that is there (0 or
    2) as missing: rank 0 names rank 1; rank 2, whose creation's members both failed, names
    nobody (before: rank 2 listed rank 0, which had failed at another creation)."""
    body = functools.partial(_frozen_after_its_first_creation, tmp=str(tmp_path))
    reports = run_ranks(body, 3, timeout=90, env=GATE, may_die=frozenset({1}))
    for rank in (0, 2):
        out = reports[rank]
        assert out["error"] in ("PeerMissingError", "ReloadPGError"), (rank, out)
        assert not {0, 2} & set(out["missing"] or []), (rank, out)
        assert out["seconds"] < WORLD_S + SLACK_S, (rank, out)
    assert reports[0]["missing"] == [1], reports[0]


# ---- item 6: the retry after a SIGINT inside a reload -------------------------------------------


def _interrupted_then_retried(ctx: Rank) -> dict:
    """Rank 1 is interrupted (``KeyboardInterrupt``, where a SIGINT lands) while it waits for
    the reload's agreement, after counting itself in; the others go on into the creations and
    wait for it there. Every rank retries the reload after an error or an interrupt."""
    dist = ctx.begin(timeout=WORLD_S)
    import reloadpg_autopatch as rpg

    groups = [dist.new_group([0, 1, 2]), dist.new_group([1, 2])]
    rpg.destroy_process_groups()
    if ctx.rank == 1:
        fired = []

        def act(method: str, key: str) -> None:
            if method == "wait" and key.endswith("/1/agreement/done") and not fired:
                fired.append(key)
                raise KeyboardInterrupt

        _fault_store(ctx, act)
    attempts: list[dict[str, Any]] = []
    for _ in range(3):
        started = time.monotonic()
        try:
            rpg.reload_process_groups()
            attempts.append({"error": None, "seconds": time.monotonic() - started})
            break
        except (Exception, KeyboardInterrupt) as error:
            attempts.append(
                {
                    "error": type(error).__name__,
                    "missing": getattr(error, "missing", None),
                    "seconds": time.monotonic() - started,
                }
            )
    members = [g for g in groups if g is not None and not isinstance(g, int)]
    sums = [total(g, ctx.rank + 1) for g in members if ctx.rank in _ranks(g)]
    return {"attempts": attempts, "sums": sums}


def _ranks(group: Any) -> list[int]:
    import torch.distributed as dist

    try:
        return dist.get_process_group_ranks(group)
    except Exception:
        return []


def test_the_retry_after_an_interrupt_in_a_reload_meets_the_ranks_it_left() -> None:
    """Rank 1 of 3 is interrupted in the reload's agreement; ranks 0 and 2 fail their first
    attempt naming rank 1 only, and every rank's retry succeeds: rank 1's waits for the others
    to leave the attempt it left (before: it timed out first and blamed ranks 0 and 2, which
    arrived); every group works after it."""
    reports = run_ranks(_interrupted_then_retried, 3, timeout=120, env=GATE)
    first, retry = reports[1]["attempts"][0], reports[1]["attempts"][-1]
    assert first["error"] == "KeyboardInterrupt", reports[1]
    assert retry["error"] is None, reports[1]
    assert len(reports[1]["attempts"]) == 2, reports[1]
    for rank in (0, 2):
        attempts = reports[rank]["attempts"]
        assert len(attempts) == 2, (rank, attempts)
        assert attempts[0]["missing"] == [1], (rank, attempts)
        assert attempts[1]["error"] is None, (rank, attempts)
    assert [r["sums"] for r in reports] == [[6.0], [6.0, 5.0], [6.0, 5.0]], reports


# ---- a rank that dies or never comes ------------------------------------------------------

#: WORLD's timeout in the kill tests: what a survivor waits out, so the shortest that still lets
#: the good cycle before the kill finish on a loaded machine.
KILL_WORLD_S = 3
KILL_STEPS = ("destroy", "temporary", "agreement", "world", "creation")


def _killed(ctx: Rank, victim: int, step: str) -> dict:
    import time

    import reloadpg_autopatch as rpg

    dist = run_events.begin(ctx, registered=True, timeout=timedelta(seconds=KILL_WORLD_S))
    # Every free waits for its members, as NCCL 2.31's destroy does (a CPU model).
    from tests.support import destroy_barrier

    destroy_barrier.install(dist.TCPStore(ctx.host, ctx.port, ctx.world_size, is_master=False))
    groups = [dist.new_group([0, 1, 2]), dist.new_group([0, 1]), dist.new_group([1, 2])]
    rpg.destroy_process_groups()
    rpg.reload_process_groups()  # one good cycle first
    dist.barrier()  # every rank is done with it
    doomed = ctx.rank == victim
    if doomed and step == "destroy":
        os._exit(0)
    if doomed and step == "temporary":
        run_events.die_at("world")  # dies creating the temporary WORLD of the destroy
    started = time.monotonic()
    try:
        if step in ("destroy", "temporary"):
            rpg.destroy_process_groups()
            # The temporary WORLD connects lazily: its loss may show at the next step.
            rpg.reload_process_groups()
        else:
            rpg.destroy_process_groups()
            if doomed and step == "agreement":
                os._exit(0)
            if doomed:
                run_events.die_at(step)
            started = time.monotonic()
            rpg.reload_process_groups()
        outcome = "no error"
    except RuntimeError as error:
        outcome = str(error)
    del groups
    return {"outcome": outcome, "seconds": time.monotonic() - started}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("step", KILL_STEPS)
@pytest.mark.parametrize("victim", [0, 1, 2], ids=["store-host", "rank1", "rank2"])
def test_a_rank_that_dies_in_a_step_fails_the_others_within_worlds_timeout(
    victim: int, step: str
) -> None:
    """Every survivor raises within WORLD's timeout plus a few seconds (never a group's own
    30-minute default), naming the step, the cycle and the missing rank (or the lost store).
    Every free waits for its members there, as NCCL 2.31's destroy does
    (``tests/support/destroy_barrier.py``)."""
    reports = run_ranks(
        functools.partial(_killed, victim=victim, step=step),
        3,
        timeout=120,
        env=GATE,
        store_in_rank0=True,
        may_die=frozenset({victim}),
    )
    phrases = {
        "destroy": ("destroy",),
        "temporary": ("temporary", "agreement"),
        "agreement": ("agreement",),
        "world": ("WORLD",),
        "creation": ("creating group",),
    }
    for rank, report in enumerate(reports):
        if rank == victim:
            continue
        message = report["outcome"]
        assert report["seconds"] < KILL_WORLD_S + 10, (rank, report)
        assert "cycle" in message, (rank, message)
        if victim == 0:
            # A survivor learns of the lost store at its next store call, which may belong to
            # the step before the one the host died in.
            assert "store is unreachable" in message, (rank, message)
        else:
            assert any(phrase in message for phrase in phrases[step]), (rank, message)
            assert f"ranks {victim}" in message, (rank, message)
