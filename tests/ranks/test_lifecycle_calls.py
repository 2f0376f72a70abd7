"""The steps called where a real program calls them, and what a destroy leaves.

Destroy or reload twice in a row on one rank and once on its peer; a destroy right after a
creation; a destroy before ``init_process_group`` (nothing happens, and the real cycles after it
are whole); a group just released is not listed; non-members take part in every creation
(``TORCH_DIST_INIT_BARRIER=1``), also of a group released on one rank; a rank whose creations
lag during the reload; a thread waiting in a collective while its group is destroyed gets the
package's error; names stay unique and say "reload" while destroyed; a dropped wrapper is
collected and its sockets closed.

The oracles are outside the package: collective results computed by hand, ``/proc/self/fd`` and
``/proc/self/task``, ``weakref`` + ``gc``, the default groups torch builds, object identity and
the exceptions' types and messages. Every rank is a real gloo rank that the gate activated.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.support import os_counts, registered_world, run_events, world_ranks
from tests.support.ranks import GATE, Rank, run_ranks, total

pytestmark = pytest.mark.timeout(300)

# ---- destroy or reload twice on one rank ---------------------------------------------------------


def _asymmetric(ctx: Rank) -> list[dict]:
    import reloadpg_autopatch as rpg

    dist = registered_world.start(ctx)
    groups = {"a": dist.new_group([0, 1]), "b": dist.new_group([1, 0])}
    cycles = []
    for cycle in range(4):
        twice = ctx.rank == cycle % 2
        rpg.destroy_process_groups()
        if twice and cycle < 2:
            rpg.destroy_process_groups()  # a second destroy in a row on this rank only
        rpg.reload_process_groups()
        if twice and cycle >= 2:
            rpg.reload_process_groups()  # a second reload in a row on this rank only
        cycles.append(registered_world.sums(dist, {**groups, "world": dist.group.WORLD}, ctx.rank))
    fresh = dist.new_group([0, 1])  # names and keys still aligned afterwards
    cycles.append(registered_world.sums(dist, {"fresh": fresh}, ctx.rank))
    return cycles


def test_destroy_or_reload_twice_on_one_rank_once_on_its_peer() -> None:
    both = registered_world.expected([0, 1])
    for cycles in run_ranks(_asymmetric, 2, env=GATE, timeout=200):
        for sums in cycles[:-1]:
            assert sums == {"a": both, "b": both, "world": both}
        assert cycles[-1] == {"fresh": both}


# ---- what a destroy leaves: a dropped wrapper is collected ---------------------------------------


def _dropped(ctx: Rank) -> dict:
    import gc
    import weakref

    import torch

    import reloadpg_autopatch as rpg

    dist = registered_world.start(ctx, register=os.environ["BLIND_SPOTS_WORLD"] == "registered")
    kept = dist.new_group([0, 1])
    before = (os_counts.sockets(), os_counts.threads())
    ref = weakref.ref(dist.new_group([0, 1]))  # dropped at once
    gc.collect()
    collected = ref() is None
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    gc.collect()
    t = torch.ones(1)
    dist.all_reduce(t, group=kept)
    return {
        "collected_at_once": collected,
        "collected_after_cycle": ref() is None,
        "before": before,
        "after": (os_counts.sockets(), os_counts.threads()),
        "kept": t.item(),
    }


@pytest.mark.parametrize("world", ["registered", "not registered"])
def test_wrapper_mode_a_dropped_group_is_collected_and_its_sockets_closed(world: str) -> None:
    # Registered, WORLD's swap tears down every group torch knows; not registered, only the
    # package's own destroy can close the dropped group's sockets.
    env = {**GATE, "BLIND_SPOTS_WORLD": world}
    for report in run_ranks(_dropped, 2, env=env, timeout=200):
        assert report["kept"] == 2.0
        assert report["collected_at_once"]
        assert report["collected_after_cycle"]
        # The cycle replaced the kept group's and WORLD's communicators like for like; the
        # dropped group's sockets and threads must not be among those still open.
        assert report["after"][0] <= report["before"][0]
        assert report["after"][1] <= report["before"][1]


# ---- non-members take part in every creation -----------------------------------------------------


def _non_members(ctx: Rank) -> dict:
    import reloadpg_autopatch as rpg

    dist = registered_world.start(ctx)
    low = dist.new_group([0, 1])
    high = dist.new_group([1, 2])
    mine = {
        label: g
        for label, g in (("low", low), ("high", high))
        if ctx.rank in {"low": (0, 1), "high": (1, 2)}[label]
    }
    out: dict[str, Any] = {"cycles": [], "released": []}
    for _ in range(2):
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        out["cycles"].append(
            registered_world.sums(dist, {**mine, "world": dist.group.WORLD}, ctx.rank)
        )
    if ctx.rank == 0:
        dist.destroy_process_group(low)  # released on rank 0 only; rank 1 still holds it
        mine.pop("low")
    else:
        mine.pop("low", None)  # rank 1 holds it but cannot use it without rank 0
    for _ in range(2):
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        out["released"].append(
            registered_world.sums(dist, {**mine, "world": dist.group.WORLD}, ctx.rank)
        )
    fresh = dist.new_group([0, 1])  # creations still aligned on all three ranks
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    out["fresh"] = registered_world.sums(dist, {"fresh": fresh}, ctx.rank) if ctx.rank < 2 else {}
    out["low_alive"] = ctx.rank != 1 or dist.get_process_group_ranks(low) == [0, 1]
    return out


def test_non_members_take_part_and_a_group_released_on_one_rank(capfd: Any) -> None:
    env = {**GATE, "TORCH_DIST_INIT_BARRIER": "1"}
    world = registered_world.expected([0, 1, 2])
    members = {"low": [0, 1], "high": [1, 2]}
    for rank, report in enumerate(run_ranks(_non_members, 3, env=env, timeout=280)):
        mine = {k: registered_world.expected(v) for k, v in members.items() if rank in v}
        assert report["cycles"] == [{**mine, "world": world}] * 2
        mine.pop("low", None)
        assert report["released"] == [{**mine, "world": world}] * 2
        assert report["fresh"] == ({"fresh": registered_world.expected([0, 1])} if rank < 2 else {})
        assert report["low_alive"]
    assert "Connection closed by peer" not in capfd.readouterr().err


# ---- one rank's creations lag; a destroy right after a creation; a group just released -----------


#: How long each of the lagging rank's creations waits: far longer than a gloo handshake.
LAG_S = 0.5


def _lagging(ctx: Rank) -> list[dict]:
    import time

    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch as rpg

    dist = registered_world.start(ctx, register=os.environ["BLIND_SPOTS_WORLD"] == "registered")
    lag = {"on": False}
    # Both ranks on one core, the lagging one at the lowest priority: a handshake its peer
    # tears down too early then fails as "Connection closed by peer" instead of slipping by.
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    if ctx.rank == 1:
        os.nice(19)
        real = c10d._new_process_group_helper

        def slow(*args: Any, **kwargs: Any) -> Any:
            if lag["on"]:
                time.sleep(LAG_S)
            return real(*args, **kwargs)

        c10d._new_process_group_helper = slow
    kept = [dist.new_group([0, 1]), dist.new_group([1, 0])]
    released = dist.new_group([0, 1])
    # A collective on each group the program makes: both ranks are past its handshake before
    # either destroys anything (test_destroy_right_after_a_creation is about that race).
    registered_world.sums(dist, {"released": released}, ctx.rank)
    one_sided = []
    cycles = []
    for cycle in range(4):
        if cycle in (1, 2) and ctx.rank == 0:
            # Released on rank 0 only: rank 0 takes part in its re-creation and frees it at
            # once. It is the last creation of the reload, so nothing else holds rank 0 back.
            dist.destroy_process_group(one_sided[cycle - 1])
        if cycle == 2:
            dist.destroy_process_group(released)  # released on both ranks
        rpg.destroy_process_groups()
        lag["on"] = True
        rpg.reload_process_groups()
        lag["on"] = False
        groups = {str(i): g for i, g in enumerate(kept)}
        cycles.append(registered_world.sums(dist, {**groups, "world": dist.group.WORLD}, ctx.rank))
        made = {}
        if cycle == 0:
            made["kept"] = dist.new_group([0, 1])
            kept.append(made["kept"])  # made between cycles, kept
        made["dropped"] = dist.new_group([0, 1])
        made["one_sided"] = dist.new_group([0, 1])  # the last creation of the next reload
        registered_world.sums(dist, made, ctx.rank)
        one_sided.append(made.pop("one_sided"))
        del made  # the "dropped" group, on both ranks
    return cycles


@pytest.mark.parametrize("world", ["registered", "not registered"])
def test_a_rank_whose_creations_lag_during_reload(world: str, capfd: Any) -> None:
    """Over 10 s: four cycles in which each of rank 1's creations waits ``LAG_S``, on one core."""
    both = registered_world.expected([0, 1])
    env = {**GATE, "BLIND_SPOTS_WORLD": world}
    for cycles in run_ranks(_lagging, 2, env=env, timeout=280):
        assert cycles[0] == {"0": both, "1": both, "world": both}
        for sums in cycles[1:]:
            assert sums == {"0": both, "1": both, "2": both, "world": both}
    # The ranks share this process's stderr: gloo logs a torn handshake even when it recovers.
    assert "Connection closed by peer" not in capfd.readouterr().err


def _destroy_after_creating(ctx: Rank) -> list[dict]:
    import reloadpg_autopatch as rpg

    dist = registered_world.start(ctx, register=os.environ["BLIND_SPOTS_WORLD"] == "registered")
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # as in _lagging
    if ctx.rank == 1:
        os.nice(19)
    out = []
    held = []
    for _ in range(4):
        held.extend(dist.new_group([0, 1]) for _ in range(3))
        rpg.destroy_process_groups()  # right after the creations, as a training step may
        rpg.reload_process_groups()
        out.append(registered_world.sums(dist, {"g": held[-1]}, ctx.rank))
    return out


@pytest.mark.parametrize("world", ["registered", "not registered"])
def test_destroy_right_after_a_creation(world: str) -> None:
    env = {**GATE, "BLIND_SPOTS_WORLD": world}
    for report in run_ranks(_destroy_after_creating, 2, env=env, timeout=200):
        assert report == [{"g": registered_world.expected([0, 1])}] * 4


def _released_listed(ctx: Rank) -> dict:
    import gc

    import reloadpg_autopatch as rpg

    dist = registered_world.start(ctx, register=False)
    kept = dist.new_group([0, 1])
    gone = dist.new_group([0, 1])
    dist.destroy_process_group(gone)
    listed = rpg.reloadable_groups()
    out = {
        "gone_listed": any(g is gone for g in listed),
        "kept_listed": any(g is kept for g in listed),
    }
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    gc.collect()
    listed = rpg.reloadable_groups()
    out["gone_listed_after_cycle"] = any(g is gone for g in listed)
    return out


def test_reloadable_groups_leaves_out_a_group_just_released() -> None:
    for report in run_ranks(_released_listed, 2, env=GATE):
        assert report == {
            "gone_listed": False,
            "kept_listed": True,
            "gone_listed_after_cycle": False,
        }


# ---- destroy before init leaves no trace ---------------------------------------------------------


def _destroy_before_init(ctx: Rank) -> dict:
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    calls = {"before_destroy": 0, "after_reload": 0}

    def before(groups: list[Any]) -> None:
        calls["before_destroy"] += 1

    def after(groups: list[Any]) -> None:
        calls["after_reload"] += 1

    rpg.add_reload_hook(before_destroy=before, after_reload=after, name="counter")
    out: dict[str, Any] = {"initialized_before": dist.is_initialized()}
    try:
        rpg.destroy_process_groups()
        out["early"] = "no error"
    except Exception as error:
        out["early"] = world_ranks.error_text(error)
    out["early_calls"] = dict(calls)
    early_report = rpg.last_cycle_report()
    out["early_report"] = None if early_report is None else early_report.to_dict()

    world_ranks.begin(ctx)
    rpg.register_default_process_group(world_ranks.TIMEOUT, accelerator_backends=world_ranks.SWAP)
    pair = dist.new_group([0, 1])
    worlds = world_ranks.DefaultGroups()
    cycles = []
    for _ in range(3):
        before_calls, built = dict(calls), worlds.built
        rpg.destroy_process_groups()
        built_in_destroy = worlds.built - built
        rpg.reload_process_groups()
        cycle = rpg.last_cycle_report()
        cycles.append(
            {
                "hooks": {k: calls[k] - before_calls[k] for k in calls},
                "worlds_built_in_destroy": built_in_destroy,
                "worlds_built": worlds.built - built,
                "report_cycle": None if cycle is None else cycle.cycle,
                "destroy_phases": (
                    None if cycle is None or cycle.destroy is None else sorted(cycle.destroy.phases)
                ),
                "sums": [total(None, ctx.rank + 1), total(pair, ctx.rank + 1)],
            }
        )
    out["cycles"] = cycles
    out["calls"] = calls
    return out


def test_destroy_before_init_does_nothing_and_the_real_cycles_are_whole() -> None:
    """``destroy_process_groups()`` before ``init_process_group()``: no hook, no report, no
    error. Then three real cycles each run both hooks once, sync, and swap WORLD (torch builds
    the temporary WORLD in the destroy and the restored one in the reload)."""
    for rank, report in enumerate(run_ranks(_destroy_before_init, 2, timeout=120, env=GATE)):
        assert report["initialized_before"] is False
        assert report["early"] == "no error", (rank, report)
        assert report["early_calls"] == {"before_destroy": 0, "after_reload": 0}, (rank, report)
        assert report["early_report"] is None, (rank, report)
        for number, cycle in enumerate(report["cycles"], start=1):
            assert cycle["hooks"] == {"before_destroy": 1, "after_reload": 1}, (rank, cycle)
            assert cycle["worlds_built_in_destroy"] == 1, (rank, cycle)
            assert cycle["worlds_built"] == 2, (rank, cycle)
            assert cycle["report_cycle"] == number, (rank, cycle)
            assert cycle["destroy_phases"] is not None, (rank, cycle)
            assert "sync" in cycle["destroy_phases"], (rank, cycle)
            assert cycle["sums"] == [3.0, 3.0], (rank, cycle)
        assert report["calls"] == {"before_destroy": 3, "after_reload": 3}, (rank, report)


# ---- names while destroyed -----------------------------------------------------------------------


def _names_while_destroyed(ctx: Rank) -> dict:
    import torch
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch as rpg

    dist = run_events.begin(ctx, registered=True)
    pair = dist.new_group([0, 1])
    name = pair.group_name  # handed out, as DeviceMesh and functional collectives keep it
    made_while_destroyed = []
    lookups = []
    for _ in range(3):
        rpg.destroy_process_groups()
        made_while_destroyed.append(dist.new_group([0, 1], use_local_synchronization=True))
        for call in (
            lambda: funcol.all_reduce(torch.ones(1), "sum", name).wait(),
            lambda: c10d._resolve_process_group(name).size(),
        ):
            try:
                call()
                lookups.append("no error")
            except RuntimeError as error:
                lookups.append(str(error))
        rpg.reload_process_groups()
    sums = [total(g, ctx.rank + 1) for g in [pair, *made_while_destroyed]]
    names = [g.group_name for g in made_while_destroyed]
    return {"sums": sums, "lookups": lookups, "distinct": len(set(names)) == len(names)}


def test_names_stay_unique_and_say_reload_while_destroyed() -> None:
    for report in run_ranks(_names_while_destroyed, 2, timeout=180, env=GATE):
        assert report["sums"] == [3.0] * 4
        assert report["distinct"]
        for message in report["lookups"]:
            assert "reload_process_groups()" in message, message


# ---- a thread in a collective while its group is destroyed ---------------------------------------


def _collective_during_destroy(ctx: Rank) -> dict:
    import threading
    import time

    import torch

    import reloadpg_autopatch as rpg

    dist = run_events.begin(ctx, registered=False)
    pair = dist.new_group([0, 1])
    box: dict[str, Any] = {}
    if ctx.rank == 0:

        def stuck() -> None:  # rank 1 never joins this all_reduce
            started = time.monotonic()
            try:
                dist.all_reduce(torch.ones(1), group=pair)
                box["outcome"] = "no error"
            except Exception as error:
                box["outcome"] = f"{type(error).__name__}: {error}"
            box["seconds"] = time.monotonic() - started

        worker = threading.Thread(target=stuck, daemon=True)
        worker.start()
    time.sleep(1.0)  # the worker is blocked in the collective; both ranks destroy now
    rpg.destroy_process_groups()
    if ctx.rank == 0:
        worker.join(20)
        box.setdefault("outcome", "hang: still blocked 20 s after destroy")
    rpg.reload_process_groups()
    box["sum"] = total(pair, 1)
    return box


def test_a_thread_in_a_collective_on_a_destroyed_group_gets_the_packages_error() -> None:
    for attempt in range(3):  # the race had two outcomes in four runs: try it more than once
        reports = run_ranks(_collective_during_destroy, 2, timeout=120, env=GATE)
        outcome = reports[0]["outcome"]
        assert "reload_process_groups()" in outcome, (attempt, outcome)
        assert [r["sum"] for r in reports] == [2.0, 2.0]
