"""Suspend mode's steps under what a run does to them.

A suspend or resume that raises breaks that group and the step goes on; a group released while
asleep, on every rank or on one member only, goes after its resume and stalls nobody; ending
WORLD while asleep resumes every communicator first; a forked child never suspends or resumes;
two threads destroying at once get one step and one refusal.

The stand-in of ``reloadpg_autopatch/tools/cpu_nccl`` logs every call that reaches it (and in
which state), which is the oracle with torch's results and the exceptions raised.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from tests.support import suspend_ranks
from tests.support.ranks import Rank

pytestmark = pytest.mark.timeout(300)

# ---- a suspend or a resume that raises: the group is broken, the others go on ----------------


def _broken(ctx: Rank) -> dict[str, Any]:
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx)
    s.configure(fail_after_barrier="suspend")
    bad_s = dist.new_group([0, 1], backend=leg, group_desc="bad-suspend")
    s.configure(fail_after_barrier="resume")
    bad_r = dist.new_group([0, 1], backend=leg, group_desc="bad-resume")
    s.configure()
    good = dist.new_group([0, 1], backend=leg, group_desc="good")
    groups = {"bad-suspend": bad_s, "bad-resume": bad_r, "good": good}

    def use() -> dict[str, tuple[str, Any]]:
        return {
            n: suspend_ranks.outcome(lambda g=g: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))
            for n, g in groups.items()
        }

    out: dict[str, Any] = {
        "destroy": suspend_ranks.outcome(rpg.destroy_process_groups),
        "asleep": use(),
    }
    out["reload"] = suspend_ranks.outcome(rpg.reload_process_groups)
    out["after"] = use()
    out["second destroy"] = suspend_ranks.outcome(rpg.destroy_process_groups)
    out["second asleep"] = use()
    out["second reload"] = suspend_ranks.outcome(rpg.reload_process_groups)
    out["second after"] = use()
    lifecycle = ("suspend", "resume")
    out["log"] = {
        n: [
            (c[1], c[3][:8])
            for c in suspend_ranks.calls(s)
            if c[0] == suspend_ranks.backend(g).label and c[1] in lifecycle
        ]
        for n, g in groups.items()
    }
    return out


def test_a_failed_suspend_or_resume_breaks_that_group_and_the_step_goes_on() -> None:
    """A suspend that raises (after NCCL's barrier) and a resume that raises: the step
    completes for the healthy group and then raises ``GroupBrokenError`` naming the broken
    group and the call; the broken groups refuse every use with ``GroupBrokenError`` from then
    on (asleep, after the reload, a cycle later) and are never suspended or resumed again;
    the healthy group sleeps and wakes every cycle."""
    for rank, out in enumerate(suspend_ranks.run_once(_broken)):
        kind, text = out["destroy"]
        assert kind == "GroupBrokenError", (rank, kind, text)
        assert "suspend" in text, text
        assert "bad-suspend" in text or "'1'" in text, text
        kind, text = out["reload"]
        assert kind == "GroupBrokenError", (rank, kind, text)
        assert "resume" in text, text
        for phase in ("asleep", "second asleep"):
            assert out[phase]["good"][0] == "GroupSuspendedError", (phase, out[phase])
        assert out["after"]["good"] == out["second after"]["good"] == ("ok", 3.0)
        for name in ("bad-suspend", "bad-resume"):
            states = [out[p][name][0] for p in ("after", "second asleep", "second after")]
            assert states == ["GroupBrokenError"] * 3, (rank, name, states)
        assert out["asleep"]["bad-suspend"][0] == "GroupBrokenError"
        assert out["second destroy"] == ("ok", None)
        assert out["second reload"] == ("ok", None)
        assert out["log"]["bad-suspend"] == [("suspend", "raised: ")], out["log"]
        assert out["log"]["bad-resume"] == [("suspend", "ok"), ("resume", "raised: ")]
        assert out["log"]["good"] == [("suspend", "ok"), ("resume", "ok")] * 2


# ---- releases while asleep, and the end of WORLD ---------------------------------------------


def _release(ctx: Rank) -> dict[str, Any]:
    """``SUSPEND_TEST_WHO`` releases ``h`` (``both`` or a rank) while it sleeps
    (``SUSPEND_TEST_WHEN=asleep``) or before the destroy (``awake``)."""
    from torch.distributed import distributed_c10d as c10d

    who, when = os.environ["SUSPEND_TEST_WHO"], os.environ["SUSPEND_TEST_WHEN"]
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(
        ctx, timeout=10.0
    )  # a peer that never comes: 10 s, not 30
    g = dist.new_group([0, 1], backend=leg, group_desc="kept")
    h = dist.new_group([0, 1], backend=leg, group_desc="released")
    h_backend, h_native = suspend_ranks.backend(h), getattr(h, "group", h)
    made = s.creations()
    releases = who == "both" or int(who) == ctx.rank
    out: dict[str, Any] = {"releases": releases}
    if when == "asleep":
        rpg.destroy_process_groups()
    seen = len(s.CALLS)
    if releases:
        dist.destroy_process_group(h)
    out["at release"] = suspend_ranks.calls(s, seen)
    if when == "awake":
        out["destroy"] = suspend_ranks.outcome(rpg.destroy_process_groups)
    out["reload"] = suspend_ranks.outcome(rpg.reload_process_groups)
    out["h log"] = [c[1] for c in suspend_ranks.calls(s, seen) if c[0] == h_backend.label]
    out["h resumes"] = h_backend.resumes
    out["h in pg_map"] = h_native in c10d._world.pg_map
    out["g"] = suspend_ranks.outcome(lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))
    out["second cycle"] = (
        suspend_ranks.outcome(rpg.destroy_process_groups),
        suspend_ranks.outcome(rpg.reload_process_groups),
    )
    out["g after"] = suspend_ranks.outcome(lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))
    out["creations"] = s.creations() - made
    return out


def test_a_group_released_on_every_rank_while_asleep_goes_after_its_resume() -> None:
    """``destroy_process_group(h)`` on every rank while ``h`` sleeps: nothing happens at the
    call; the next reload resumes ``h`` (the stand-in logs the resume before the shutdown
    where its shutdown reaches Python) and then torch forgets it; no group is created for it
    (zero creations), and the other group works through later cycles."""
    for rank, out in enumerate(
        suspend_ranks.run_once(_release, SUSPEND_TEST_WHO="both", SUSPEND_TEST_WHEN="asleep")
    ):
        assert out["at release"] == [], out["at release"]
        assert out["reload"] == ("ok", None), out["reload"]
        assert out["h resumes"] == 1
        assert out["h log"][0] == "resume", out["h log"]
        if "shutdown" in out["h log"]:
            assert out["h log"].index("resume") < out["h log"].index("shutdown"), out["h log"]
        assert not out["h in pg_map"]
        assert out["g"] == out["g after"] == ("ok", 3.0)
        assert out["second cycle"] == (("ok", None), ("ok", None))
        assert out["creations"] == 0, f"rank {rank}: {out['creations']} groups created"


@pytest.mark.parametrize("when", ["asleep", "awake"])
def test_a_group_released_on_one_member_does_not_stall_the_others(when: str) -> None:
    """Rank 1 alone releases ``h`` (while it sleeps, or while awake before the destroy): every
    rank still completes the destroy and the reload, no group is created, and the other group
    works on; nobody waits for a peer that let ``h`` go."""
    ranks = suspend_ranks.run_once(_release, SUSPEND_TEST_WHO="1", SUSPEND_TEST_WHEN=when)
    for rank, out in enumerate(ranks):
        if when == "awake":
            assert out["destroy"] == ("ok", None), (rank, out["destroy"])
        assert out["reload"] == ("ok", None), (rank, out["reload"])
        assert out["g"] == out["g after"] == ("ok", 3.0), rank
        assert out["second cycle"] == (("ok", None), ("ok", None)), rank
        assert out["creations"] == 0, (rank, out["creations"])


def _end_world(ctx: Rank) -> dict[str, Any]:
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx, world=leg, register=True)
    tp = dist.new_group([0, 1], backend=leg, group_desc="tp")
    labels = [b.label for b in s.backends()]
    rpg.destroy_process_groups()
    seen = len(s.CALLS)
    out: dict[str, Any] = {"end": suspend_ranks.outcome(dist.destroy_process_group)}
    out["log"] = [(c[0], c[1], c[3]) for c in suspend_ranks.calls(s, seen)]
    out["labels"] = labels
    out["resumes"] = [b.resumes for b in s.backends()]
    out["initialized"] = dist.is_initialized()
    out["tp"] = suspend_ranks.outcome(lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, tp))[0]
    # A new world on the same store works, with a group that sleeps and wakes.
    from datetime import timedelta

    ctx.reinit("second-world/", timedelta(seconds=30))
    fresh = dist.new_group([0, 1], backend=leg)
    out["fresh cycle"] = (
        suspend_ranks.outcome(rpg.destroy_process_groups),
        suspend_ranks.outcome(rpg.reload_process_groups),
    )
    out["fresh"] = suspend_ranks.outcome(
        lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, fresh)
    )
    return out


def test_ending_world_while_asleep_resumes_every_communicator_first() -> None:
    """``dist.destroy_process_group()`` while WORLD and a group sleep: it returns, every
    suspended backend was resumed once before torch shut it down (the stand-in logs both where
    the shutdown reaches Python), torch is no longer initialized, and a new world works."""
    for rank, out in enumerate(suspend_ranks.run_once(_end_world)):
        assert out["end"] == ("ok", None), out["end"]
        assert out["resumes"] == [1, 1], out["resumes"]
        for label in out["labels"]:
            ops = [op for backend, op, outcome in out["log"] if backend == label]
            assert ops[0] == "resume", (rank, label, ops)
            if "shutdown" in ops:
                assert ops.index("resume") < ops.index("shutdown"), (label, ops)
        assert all(outcome == "ok" for _, _, outcome in out["log"]), out["log"]
        assert out["initialized"] is False
        if (
            not suspend_ranks.ON_214
        ):  # the wrapper says its WORLD ended (2.14: torch's own group, torch's rules)
            assert out["tp"] == "GroupDestroyedError", out["tp"]
        assert out["fresh cycle"] == (("ok", None), ("ok", None))
        assert out["fresh"] == ("ok", 3.0)


# ---- a forked child, and two threads -------------------------------------------------------


def _child(rpg: Any, s: Any, dist: Any, torch: Any, group: Any) -> dict[str, Any]:
    """In a forked child: time destroy and reload, and what reached the stand-in."""
    import json

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into the rank
        try:
            seen = len(s.CALLS)
            started = time.monotonic()
            steps = [
                suspend_ranks.outcome(rpg.destroy_process_groups),
                suspend_ranks.outcome(rpg.reload_process_groups),
            ]
            report = {
                "seconds": time.monotonic() - started,
                "steps": steps,
                "log": suspend_ranks.calls(s, seen, stats=True),
                "use": suspend_ranks.outcome(
                    lambda: suspend_ranks.backend(group).memory_stats()["suspended"]
                ),
            }
        except BaseException as error:
            report = {"error": repr(error)}
        os.write(write, json.dumps(report).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    return {"status": status, **json.loads(b"".join(chunks))}


def _process(ctx: Rank) -> dict[str, Any]:
    import threading

    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx)
    tp = dist.new_group([0, 1], backend=leg, group_desc="tp")
    # Rank 0 alone forks: a child that took part in a step would wait for a peer that never
    # comes (or meet rank 1's child, were both to fork).
    forks = ctx.rank == 0
    out: dict[str, Any] = {"child awake": _child(rpg, s, dist, torch, tp) if forks else None}
    rpg.destroy_process_groups()
    out["child asleep"] = _child(rpg, s, dist, torch, tp) if forks else None
    out["parent asleep"] = suspend_ranks.outcome(
        lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, tp)
    )[0]
    out["parent reload"] = suspend_ranks.outcome(rpg.reload_process_groups)
    out["parent after"] = suspend_ranks.outcome(
        lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, tp)
    )
    # Two threads destroy at once; a slow before-destroy hook keeps the first one inside.
    results: list[tuple[str, Any]] = []
    start = threading.Barrier(2)

    def destroy() -> None:
        start.wait()
        results.append(suspend_ranks.outcome(rpg.destroy_process_groups))

    handle = rpg.add_reload_hook(before_destroy=lambda groups: time.sleep(1.5), name="slow")
    threads = [threading.Thread(target=destroy) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    handle.remove()
    out["threads"] = sorted(results)
    out["threads suspends"] = [op for _, op, _, _ in suspend_ranks.calls(s) if op == "suspend"]
    out["threads reload"] = suspend_ranks.outcome(rpg.reload_process_groups)
    out["threads after"] = suspend_ranks.outcome(
        lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, tp)
    )
    return out


def test_a_forked_child_never_suspends_or_resumes() -> None:
    """``os.fork()`` in rank 0, awake and asleep: the child's ``destroy_process_groups()`` and
    ``reload_process_groups()`` return at once, nothing reaches the stand-in in the child (not
    even ``memory_stats``), and the parents' cycle goes on as if nothing happened."""
    for rank, out in enumerate(suspend_ranks.run_once(_process)):
        for when in ("child awake", "child asleep") if rank == 0 else ():
            child = out[when]
            assert "error" not in child, (rank, when, child)
            assert child["status"] == 0
            assert child["steps"] == [["ok", None], ["ok", None]], child["steps"]
            assert child["seconds"] < 1.0, child["seconds"]
            assert child["log"] == [], (rank, when, child["log"])
        if rank == 0:
            assert out["child asleep"]["use"] == ["ok", 1]  # still asleep in the child
        assert out["parent asleep"] == "GroupSuspendedError"
        assert out["parent reload"] == ("ok", None)
        assert out["parent after"] == ("ok", 3.0)


def test_two_threads_destroying_at_once_get_one_step_and_one_refusal() -> None:
    """Two threads of a rank call ``destroy_process_groups()`` together: one completes (one
    suspend), the other raises ``StepInProgressError``; the reload then works."""
    for rank, out in enumerate(suspend_ranks.run_once(_process)):
        kinds = [kind for kind, _ in out["threads"]]
        assert kinds == ["StepInProgressError", "ok"], (rank, out["threads"])
        assert "another thread" in out["threads"][0][1]
        assert len(out["threads suspends"]) == 2  # the first cycle's and this one
        assert out["threads reload"] == ("ok", None)
        assert out["threads after"] == ("ok", 3.0)
