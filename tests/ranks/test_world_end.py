"""A world ends, and another begins.

``destroy_process_group(WORLD)`` ends the world; a world torn down, or replaced behind the
package's back by torch's unpatched destroy, leaves its groups dead; a second world starts with
nothing left awake from the first; a WORLD re-initialised on the same store without a new
prefix (as ``env://`` does), or a world on a store an earlier world used, never reads the
earlier world's keys; a process that ended a world meets a fresh one, and a Ray actor restarted
by Ray meets the survivors (real Ray).

The oracles are torch's and the store's: collective results, ``is_initialized()``, the native
groups torch builds, the store's own keys, the wall clock against WORLD's timeout, and the
exceptions raised.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest

from tests.support import (
    PROGRAMS,
    accelerator,
    patched_ranks,
    registered_world,
    run_events,
    stores,
    world_ranks,
)
from tests.support.ranks import GATE, Rank, errors_of, run_ranks, total
from tests.support.venv import ROOT, clean_env

pytestmark = pytest.mark.timeout(300)

# ---- the program ends its world ------------------------------------------------------------------


def _explicit_world_destroy(ctx: Rank) -> dict:
    import torch

    import reloadpg_autopatch as rpg

    dist = run_events.begin(ctx, registered=True)
    pair = dist.new_group([0, 1])
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    dist.destroy_process_group(dist.group.WORLD)  # WORLD named explicitly: its stand-in
    out: dict[str, Any] = {"initialized": dist.is_initialized()}
    try:
        dist.all_reduce(torch.ones(1), group=pair)
        out["old group"] = "no error"
    except RuntimeError as error:
        out["old group"] = str(error)
    ctx.reinit("after-explicit-destroy/", run_events.TIMEOUT)
    out["new world"] = total(dist.new_group([0, 1]), 1)
    return out


def test_destroying_world_by_name_ends_the_world() -> None:
    """``destroy_process_group(dist.group.WORLD)`` is the program ending its world, as with no
    argument: torch says it is no longer initialized, old groups say so, a new world works."""
    for report in run_ranks(_explicit_world_destroy, 2, env=GATE):
        assert report["initialized"] is False, report
        assert "destroy" in report["old group"], report
        assert "WORLD" in report["old group"], report
        assert report["new world"] == 2.0


# ---- the program tears WORLD down and initializes it again -------------------------------


def _teardown(ctx: Rank, registered: bool) -> dict:
    import torch

    import reloadpg_autopatch as rpg

    dist = patched_ranks.start(ctx, registered)
    old = dist.new_group([0, 1])
    old_single = [dist.new_group([r]) for r in range(2)][ctx.rank]
    report: dict[str, Any] = {"old_sum": total(old, ctx.rank + 1)}

    dist.destroy_process_group()  # the program ends its world itself
    ctx.reinit("second-world/", patched_ranks.TIMEOUT, store_timeout=patched_ranks.TIMEOUT)
    if registered:
        rpg.register_default_process_group(patched_ranks.TIMEOUT, accelerator_backends=("gloo",))
    spy = patched_ranks.NativeSpy()
    new = dist.new_group([0, 1])

    def old_errors() -> dict:
        return errors_of(
            {
                "all_reduce": lambda: dist.all_reduce(torch.ones(1), group=old),
                "get_world_size": lambda: dist.get_world_size(old),
                "method": old.rank,
                "property": lambda: old.group_name,
                "single": lambda: dist.all_reduce(torch.ones(1), group=old_single),
            }
        )

    report["right_after_init"] = old_errors()
    cycles = []
    for _ in range(3):
        rpg.destroy_process_groups()
        created = spy.during(rpg.reload_process_groups)
        cycles.append(
            {
                "created": created,
                "new_sum": total(new, ctx.rank + 1),
                "world_sum": total(None, ctx.rank + 1),
                "old": old_errors(),
            }
        )
    report["cycles"] = cycles
    return report


def _says_world_destroyed(message: str) -> bool:
    text = message.lower()
    return "world" in text and "destroy" in text


@pytest.mark.parametrize("registered", [False, True], ids=["subgroups", "WORLD"])
def test_groups_of_a_torn_down_world_stay_dead(registered: bool) -> None:
    """After the program destroys WORLD and initializes again, a reload revives nothing old."""
    world = int(registered)
    for report in run_ranks(functools.partial(_teardown, registered=registered), 2, timeout=150):
        assert report["old_sum"] == 3.0
        revived = [c["old"] for c in report["cycles"] if "no error" in c["old"].values()]
        assert revived == [], "a group of the torn-down world came back to life"
        for errors in [report["right_after_init"]] + [c["old"] for c in report["cycles"]]:
            for label, message in errors.items():
                assert _says_world_destroyed(message), f"{label}: {message}"
        for cycle in report["cycles"]:
            assert cycle["new_sum"] == 3.0
            assert cycle["world_sum"] == 3.0
            assert cycle["created"] == 1 + world  # the new world's group (and WORLD) only


def _world_replaced_behind_our_back(ctx: Rank) -> dict:
    import inspect

    import torch

    import reloadpg_autopatch as rpg

    dist = patched_ranks.start(ctx, registered=False)
    old = dist.new_group([0, 1])
    inspect.unwrap(dist.destroy_process_group)()  # torch's own, as a stale binding would call it
    ctx.reinit("replaced-world/", patched_ranks.TIMEOUT, store_timeout=patched_ranks.TIMEOUT)
    spy = patched_ranks.NativeSpy()
    new = dist.new_group([0, 1])
    cycles = []
    for _ in range(2):
        rpg.destroy_process_groups()
        cycle: dict[str, Any] = {"created": spy.during(rpg.reload_process_groups)}
        cycle["new_sum"] = total(new, ctx.rank + 1)
        try:
            dist.all_reduce(torch.ones(1), group=old)
            cycle["old"] = "no error"
        except RuntimeError as error:
            cycle["old"] = str(error)
        cycles.append(cycle)
    return {"cycles": cycles}


def test_a_world_replaced_behind_our_back_ends_its_groups() -> None:
    """torch's unpatched destroy tears WORLD down without telling us; the next world's reload
    must rebuild only its own groups and the old ones must say their world is gone."""
    for report in run_ranks(_world_replaced_behind_our_back, 2, timeout=120):
        for cycle in report["cycles"]:
            assert cycle["created"] == 1
            assert cycle["new_sum"] == 3.0
            assert _says_world_destroyed(cycle["old"]), cycle["old"]


# ---- a second world, and a WORLD re-initialised on the same store --------------------------------


def _second_world(ctx: Rank) -> dict[str, Any]:
    torch, dist, rpg, s = accelerator.start(ctx, "suspend")
    # World 1: a gloo group is left awake (named in every destroy's agreement).
    awake = dist.new_group([0, 1], group_desc="awake-gloo")
    first_name = str(awake.group_name)
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    dist.barrier()  # every rank has read the reload's result before a peer ends the world
    dist.destroy_process_group()  # the program ends world 1
    ctx.reinit("second-world/", timedelta(seconds=30))
    # World 2 counts group names from 1 again: its first group takes world 1's awake name.
    tp = dist.new_group([0, 1], backend=s.NAME_A, group_desc="tp")
    out: dict[str, Any] = {"same name": str(tp.group_name) == first_name}
    out["destroy"] = accelerator.outcome(rpg.destroy_process_groups)
    out["log"] = accelerator.backend_ops(s, tp, "suspend")
    out["reload"] = accelerator.outcome(rpg.reload_process_groups)
    out["sum"] = accelerator.rank_sum(dist, torch, ctx.rank, tp)
    return out


@pytest.mark.timeout(240)
def test_a_second_world_starts_with_nothing_left_awake_from_the_first() -> None:
    """A group world 1 left awake has the name world 2's first group takes; world 2's destroy
    must not count it as left awake (which would refuse it in suspend mode): it suspends."""
    for rank, out in enumerate(accelerator.run_once(_second_world)):
        assert out["same name"], rank  # else this test proves nothing
        assert out["destroy"] == ("ok", None), (rank, out["destroy"])
        assert out["log"] == [("suspend", "ok")], (rank, out["log"])
        assert out["sum"] == 3.0


def _same_store(ctx: Rank) -> dict:
    import time

    import torch.distributed as dist

    gated = os.environ.get("SLIME_RELOADABLE_PG") == "1"
    if gated:
        import reloadpg_autopatch as rpg

        registered_world.start(ctx)
    else:
        ctx.init(timeout=registered_world.TIMEOUT.total_seconds())

    def cycle() -> None:
        if gated:
            rpg.destroy_process_groups()
            rpg.reload_process_groups()

    out: dict[str, Any] = {"first": [], "second": []}
    group = dist.new_group([0, 1])
    for _ in range(2):
        cycle()
        out["first"].append(
            registered_world.sums(dist, {"g": group, "world": dist.group.WORLD}, ctx.rank)
        )
    del group
    dist.destroy_process_group()
    # As env:// does: a new client of the same store, no PrefixStore.
    store = dist.TCPStore(
        ctx.host, ctx.port, ctx.world_size, is_master=False, timeout=registered_world.TIMEOUT
    )
    stores.forget_torchs_keys(store, ctx.rank, ctx.world_size)
    if ctx.rank == 1:
        time.sleep(2)  # the late rank must not read what the first world left in the store
    dist.init_process_group(
        "gloo",
        store=store,
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=registered_world.TIMEOUT,
    )
    if gated:
        rpg.register_default_process_group(registered_world.TIMEOUT, accelerator_backends=("gloo",))
    again = dist.new_group([0, 1])
    other = dist.new_group([1, 0])
    for step in range(3):
        if ctx.rank == step % 2:
            time.sleep(1)
        cycle()
        out["second"].append(
            registered_world.sums(
                dist, {"g": again, "h": other, "world": dist.group.WORLD}, ctx.rank
            )
        )
    return out


@pytest.mark.parametrize("gate", ["off", "on"])
def test_world_reinitialised_on_the_same_store_without_a_prefix(gate: str) -> None:
    both = registered_world.expected([0, 1])
    env = GATE if gate == "on" else {"SLIME_RELOADABLE_PG": None}
    for report in run_ranks(_same_store, 2, env=env, timeout=240):
        assert report["first"] == [{"g": both, "world": both}] * 2
        assert report["second"] == [{"g": both, "h": both, "world": both}] * 3


# ---- every rank of a world derives the same keys, whatever its process did before --------


def _veteran_meets_newcomer(ctx: Rank, registered: bool) -> dict:
    """Rank 0 ends a world of its own first (its process has then ended one world); rank 1 is a
    fresh process. Then both start a world together and cycle it."""
    import time

    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    rpg.set_wrap_policy("all")
    if ctx.rank == 0:
        dist.init_process_group(
            "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=world_ranks.SHORT
        )
        if registered:
            rpg.register_default_process_group(
                world_ranks.SHORT, accelerator_backends=world_ranks.SWAP
            )
        own = dist.new_group([0])
        for _ in range(2):
            rpg.destroy_process_groups()
            rpg.reload_process_groups()
        total(own, 1.0)
        dist.destroy_process_group()  # the program ends that world
    ctx.reinit("second-world/", world_ranks.SHORT)
    if registered:
        rpg.register_default_process_group(world_ranks.SHORT, accelerator_backends=world_ranks.SWAP)
    pair = dist.new_group([0, 1])
    started = time.monotonic()
    sums: list[list[float]] = []
    error = None
    try:
        for _ in range(3):
            rpg.destroy_process_groups()
            rpg.reload_process_groups()
            sums.append([total(None, ctx.rank + 1), total(pair, ctx.rank + 1)])
    except RuntimeError as exc:
        error = world_ranks.error_text(exc)
    return {"sums": sums, "error": error, "seconds": time.monotonic() - started}


@pytest.mark.parametrize("registered", [True, False], ids=["WORLD-registered", "groups-only"])
def test_a_process_that_ended_a_world_meets_a_fresh_process(registered: bool) -> None:
    """A replacement rank (fresh process) and a survivor (which ended the earlier world) cycle
    a new world together: three cycles well within WORLD's 10 s timeout, every sum right, no
    error (today each side waits under keys of its own and blames the peer that arrived)."""
    reports = run_ranks(
        functools.partial(_veteran_meets_newcomer, registered=registered),
        2,
        timeout=120,
        env=GATE,
    )
    for rank, report in enumerate(reports):
        assert report["error"] is None, (rank, report["error"])
        assert report["sums"] == [[3.0, 3.0]] * 3, (rank, report)
        assert report["seconds"] < world_ranks.SHORT.total_seconds() / 2, (rank, report)


@pytest.mark.timeout(420)
@pytest.mark.usefixtures("one_ray_cluster_at_a_time")
def test_a_ray_actor_restarted_by_ray_meets_the_survivors(tmp_path) -> None:
    """Ray restarts a killed actor (``max_restarts=1``); the survivor ends its world; all
    ranks start a new world and cycle it: within WORLD's timeout, every sum right, no error."""
    proc = subprocess.run(
        [sys.executable, str(PROGRAMS / "ray_restart.py"), str(world_ranks.SHORT.total_seconds())],
        env=clean_env(RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(ROOT)),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for info in report["info"]:
        assert info["gate"] == "1", info
        assert info["patched"], info  # runtime_env's gate alone patched the actor
        assert info["module"].startswith(str(ROOT)), info  # the tree under test
    restarted = report["restarted"]
    assert restarted is not None, report
    assert restarted["pid"] != report["info"][1]["pid"], report  # Ray really restarted it
    assert restarted["patched"], restarted
    for cycle in report["first_cycles"]:
        assert [r["error"] for r in cycle] == [None, None], cycle
    assert report["ended"] == [False], report  # torch: the survivor's world is over
    assert [r["world"] for r in report["second_init"]] == [[3.0, 3.0]] * 2, report
    cycles = report["second_cycles"]
    errors = [r["error"] for cycle in cycles for r in cycle if r["error"]]
    assert errors == [], errors
    assert len(cycles) == 3, cycles
    for cycle in cycles:
        for result in cycle:
            assert result["sums"] == [3.0, 3.0], cycle
            assert result["seconds"] < world_ranks.SHORT.total_seconds() / 2, cycle


def _creation_keys_of_two_worlds(ctx: Rank, swapped: bool) -> dict:
    """Two worlds, one after the other, on the same store and with no prefix of their own."""
    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from tests.support import stores

    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    rpg.set_wrap_policy("all")
    keys: dict[str, list[str]] = {}
    for world in ("first", "second"):
        store = dist.TCPStore(
            ctx.host, ctx.port, ctx.world_size, is_master=False, timeout=world_ranks.TIMEOUT
        )
        if world == "second":
            # torch's own WORLD rendezvous would read the first world's addresses (its keys
            # carry no world either): clear torch's keys, keep every key of the package's.
            stores.forget_torchs_keys(store, ctx.rank, ctx.world_size)
        dist.init_process_group(
            "gloo",
            store=store,
            rank=ctx.rank,
            world_size=ctx.world_size,
            timeout=world_ranks.TIMEOUT,
        )
        # Swapped, the groups are created under the restored WORLD's keys; not, under the
        # store WORLD was made with.
        if swapped:
            rpg.register_default_process_group(
                world_ranks.TIMEOUT, accelerator_backends=world_ranks.SWAP
            )
        pair = dist.new_group([0, 1])
        for _ in range(2):
            rpg.destroy_process_groups()
            rpg.reload_process_groups()
        assert total(pair, ctx.rank + 1) == 3.0
        dist.barrier()
        # What torch wrote in the store while creating the groups of every reload, and the
        # WORLD each reload restored: the peers' addresses, under the package's prefixes.
        keys[world] = sorted(k for k in store.list_keys() if "/groups/" in k or "/world/" in k)
        dist.destroy_process_group()
    return keys


@pytest.mark.parametrize("swapped", [True, False], ids=["WORLD-swapped", "groups-only"])
def test_a_world_on_a_store_an_earlier_world_used_never_reads_its_creation_keys(
    swapped: bool,
) -> None:
    """torch's own rendezvous of the groups a reload creates (and of the WORLD it restores)
    reads every peer's address under its keys: a second world on the same store, at the same
    cycles, must write them under keys of its own, or a late peer reads a dead peer's address.
    The oracle is the real store's keys: the second world adds as many as the first wrote."""
    body = functools.partial(_creation_keys_of_two_worlds, swapped=swapped)
    for rank, report in enumerate(run_ranks(body, 2, env=GATE)):
        first, second = set(report["first"]), set(report["second"])
        assert first, (rank, "no creation key in the store: the oracle sees nothing")
        assert first <= second, (rank, "the first world's keys went away")
        assert len(second - first) == len(first), (rank, sorted(first)[:2], sorted(second)[:4])
