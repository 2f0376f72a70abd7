"""The lifecycle at run length (issue 9), on real gloo ranks.

An RL run destroys and reloads its groups thousands of times, on ranks seconds apart, while it
creates and drops groups of its own: skewed ranks reload every kind of group; the native groups
built per reload stay constant over 50 steps; Megatron's dropped groups, and a group dropped on
one rank only, are not rebuilt. Fork is ``test_run_length_fork``, threads
``test_run_length_threads``.

Every oracle here observes torch, never our counters: a spy on
``distributed_c10d._new_process_group_helper`` counts the native groups torch builds,
``_world.pg_map`` says which ones exist and under which store prefix each met its peers, and
collective results are computed by hand.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.support import patched_ranks
from tests.support.ranks import Rank, pg_count, run_ranks, total

pytestmark = pytest.mark.timeout(300)

#: How long the late rank sleeps; every store and group timeout below is well above it.
SKEW_S = 1.0
STEPS = 50


def _rendezvous_prefixes() -> list[str]:
    """The full store prefix each live group but WORLD made its rendezvous under.

    torch keeps each group's store in ``_world.pg_map``: a probe key written through it shows
    the prefix on the root store, whatever ``PrefixStore`` layers sit in between.
    """
    import os

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    default = c10d._get_default_group()
    prefixes = []
    for pg, (_, store) in list(c10d._world.pg_map.items()):
        if pg is default or pg is getattr(default, "group", None):  # WORLD (or behind its stand-in)
            continue
        probe = f"run-length-probe-{os.getpid()}-{id(pg)}"
        store.set(probe, "1")
        root = store._underlying_non_prefix_store
        if isinstance(getattr(root, "target", None), dist.Store):
            # The package hands a creation its recording store, which writes under the step's
            # prefix into the world's store: list that one.
            root = root.target
            root = getattr(root, "_underlying_non_prefix_store", root)
        key = next(k for k in root.list_keys() if k.endswith(probe))
        root.delete_key(key)
        prefixes.append(key[: -len(probe)])
    return sorted(prefixes)


# ---- skewed arrival ---------------------------------------------------------------------

KINDS = {
    "plain": ({}, False),
    "local-sync": ({"use_local_synchronization": True}, False),
    "plain+WORLD": ({}, True),
    "local-sync+WORLD": ({"use_local_synchronization": True}, True),
}


def _skewed(ctx: Rank, kind: str) -> dict:
    import time

    import reloadpg_autopatch as rpg

    kwargs, registered = KINDS[kind]
    dist = patched_ranks.start(ctx, registered)
    spy = patched_ranks.NativeSpy()
    first = dist.new_group([0, 1], timeout=patched_ranks.TIMEOUT, **kwargs)
    second = dist.new_group([0, 1], timeout=patched_ranks.TIMEOUT, **kwargs)
    report: dict[str, Any] = {"before": [total(first, 1), total(second, 10)]}
    seen = set(_rendezvous_prefixes())
    cycles = []
    for cycle in range(3):
        late = ctx.rank == (1 if cycle % 2 == 0 else 0)  # each rank is the late one in turn
        if late:
            time.sleep(SKEW_S)
        rpg.destroy_process_groups()
        if late:
            time.sleep(SKEW_S)
        created = spy.during(rpg.reload_process_groups)
        prefixes = _rendezvous_prefixes()
        cycles.append(
            {
                "sums": [total(first, ctx.rank + 1), total(second, 10 * ctx.rank)],
                "created": created,
                "pg_count": pg_count(),
                "prefixes": len(prefixes),
                "reused": [p for p in prefixes if p in seen],
            }
        )
        seen.update(prefixes)
    report["cycles"] = cycles
    report["registered"] = registered
    return report


@pytest.mark.parametrize("kind", list(KINDS))
def test_skewed_ranks_reload_every_kind_of_group(kind: str) -> None:
    """Ranks reach destroy and reload seconds apart, as they do in a real run.

    A local-sync group's hashed name is reused by its replay, so the early rank can read the
    late rank's previous (closed) address from the store: ``connectFullMesh failed``. Whether
    it does depends on which side of the gloo pair connects, so the rendezvous prefixes are
    checked too: no generation may use a key prefix that an earlier one used.
    """
    reports = run_ranks(functools.partial(_skewed, kind=kind), 2, timeout=200)
    for report in reports:
        world = 1 if report["registered"] else 0
        assert report["before"] == [2.0, 20.0]
        for cycle in report["cycles"]:
            assert cycle["reused"] == [], "a reload reused an earlier generation's store keys"
            assert cycle["prefixes"] == 2
            assert cycle["sums"] == [3.0, 10.0]  # (0 + 1) + (1 + 1); 10 * 0 + 10 * 1
            assert cycle["created"] == 2 + world
            assert cycle["pg_count"] == 3  # WORLD and the two groups


# ---- run length: the registry stays bounded by the live groups ---------------------------


def _run_length(ctx: Rank, registered: bool) -> dict:
    import gc
    import time

    import torch

    import reloadpg_autopatch as rpg

    dist = patched_ranks.start(ctx, registered)
    spy = patched_ranks.NativeSpy()
    held = [dist.new_group([0, 1]), dist.new_group([0, 1])]
    expected = len(held) + registered
    report: dict[str, Any] = {"created": [], "destroy_created": [], "ms": [], "bad": []}
    for step in range(STEPS):
        pairs = [dist.new_group([0, 1]) for _ in range(3)]
        singles = [dist.new_group([r]) for r in range(2)]  # a member of one, not of the other
        mine = singles[ctx.rank]
        sums = [total(g, ctx.rank + 1) for g in pairs] + [total(mine, 5)]
        if sums != [3.0, 3.0, 3.0, 5.0]:
            report["bad"].append((step, "temporary sums", sums))
        # Released on every rank, or simply dropped (as Megatron's destroy_model_parallel does).
        dist.destroy_process_group(pairs[0])
        dist.destroy_process_group(pairs[1])
        if ctx.rank == 0:
            dist.destroy_process_group(mine)
        del pairs, singles, mine
        gc.collect()
        started = time.perf_counter()
        report["destroy_created"].append(spy.during(rpg.destroy_process_groups))
        created = spy.during(rpg.reload_process_groups)
        report["ms"].append((time.perf_counter() - started) * 1e3)
        report["created"].append(created)
        held_sums = [total(g, ctx.rank + 1) for g in held]
        if held_sums != [3.0, 3.0] or pg_count() != len(held) + 1:
            report["bad"].append((step, "held groups", held_sums, pg_count()))
        # Stop together soon after a deviation (a few steps show the trend): a growing
        # registry makes every step slower, and a misaligned name would hang the next one.
        drifted = created != expected and step >= 3
        stop = torch.tensor([float(drifted or bool(report["bad"]))])
        dist.all_reduce(stop)
        if stop.item():
            break
    report["expected"] = expected
    return report


@pytest.mark.parametrize("registered", [False, True], ids=["subgroups", "WORLD"])
def test_native_groups_per_reload_stay_constant_over_50_steps(registered: bool) -> None:
    """Each step creates, uses and releases temporary groups, then cycles.

    Released or dropped groups must not be rebuilt: the native groups torch builds per reload
    equal the groups the program still holds (plus WORLD when it is swapped).

    About 10 s: 50 steps of creations, collectives and cycles; fewer would not show a slow
    growth.
    """
    for report in run_ranks(functools.partial(_run_length, registered=registered), 2, timeout=280):
        created = report["created"]
        assert report["bad"] == []
        assert created == [report["expected"]] * STEPS, f"native groups per reload: {created}"
        assert report["destroy_created"] == [int(registered)] * STEPS  # the temporary WORLD
        print(
            f"destroy+reload: first {report['ms'][0]:.1f} ms, "
            f"last {report['ms'][-1]:.1f} ms, max {max(report['ms']):.1f} ms"
        )


def _groups_held_by(module: Any, group_class: type) -> list[str]:
    """The names of a module's globals that still hold a group (in a list or dict too)."""
    seen, names = set(), []
    for name, value in sorted(vars(module).items()):
        values = value.values() if isinstance(value, dict) else value
        for item in values if isinstance(values, (list, tuple)) else [value]:
            if isinstance(item, group_class) and id(item) not in seen:
                seen.add(id(item))
                names.append(name)
    return names


def _megatron_dropped(ctx: Rank, registered: bool) -> dict:
    import gc

    import reloadpg_autopatch as rpg

    dist = patched_ranks.start(ctx, registered)
    from megatron.core import parallel_state

    keep = dist.new_group([0, 1])
    spy = patched_ranks.NativeSpy()

    def cycle() -> int:
        rpg.destroy_process_groups()
        return spy.during(rpg.reload_process_groups)

    made = spy.during(lambda: parallel_state.initialize_model_parallel(2))
    tp = parallel_state.get_tensor_model_parallel_group()
    report = {"made": made, "live_cycle": cycle(), "tp_sum": total(tp, ctx.rank + 1)}
    del tp
    parallel_state.destroy_model_parallel()
    gc.collect()
    # Held and not destroyed: Megatron destroys the gloo groups it finds in torch's pg_map
    # (and forgets to reset one global of them), so ask torch which ones it still knows.
    from torch.distributed import distributed_c10d as c10d

    report["still_held"] = [
        name
        for name in _groups_held_by(parallel_state, dist.ProcessGroup)
        if getattr(parallel_state, name) in c10d._world.pg_map
    ]
    report["after"] = [cycle(), cycle()]
    report["keep_sum"] = total(keep, ctx.rank + 1)
    report["pg_count"] = pg_count()
    return report


@pytest.mark.parametrize("registered", [False, True], ids=["subgroups", "WORLD"])
def test_megatrons_dropped_groups_are_not_rebuilt(registered: bool) -> None:
    """``destroy_model_parallel`` only drops Megatron's groups; a cycle must not rebuild them.

    megatron-core 0.16.1 forgets to reset ``_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP`` (and
    its gloo twin): those are still held, so they are still rebuilt.
    """
    world = int(registered)
    for report in run_ranks(
        functools.partial(_megatron_dropped, registered=registered), 2, timeout=200
    ):
        held = 1 + len(report["still_held"])  # `keep` and what Megatron did not let go
        assert report["made"] > 10  # Megatron's whole set
        assert report["live_cycle"] == report["made"] + 1 + world  # all of it, and `keep`
        assert report["tp_sum"] == 3.0
        assert len(report["still_held"]) < report["made"] // 2
        assert report["after"] == [held + world] * 2, (
            f"natives rebuilt for dropped groups (still held: {report['still_held']})"
        )
        assert report["keep_sum"] == 3.0
        assert report["pg_count"] == 1 + held


def _asymmetric_drop(ctx: Rank) -> dict:
    import gc

    import reloadpg_autopatch as rpg

    dist = ctx.patched("all")
    spy = patched_ranks.NativeSpy()
    before = dist.new_group([0, 1])
    middle = dist.new_group([0, 1])
    after = dist.new_group([0, 1])
    if ctx.rank == 0:
        del middle  # rank 1 still holds it: the record is not dead yet
        gc.collect()
    rpg.destroy_process_groups()
    report = {"first": spy.during(rpg.reload_process_groups)}
    report["sums"] = [total(g, ctx.rank + 1) for g in (before, after)]
    if ctx.rank == 1:
        report["middle_size"] = dist.get_world_size(middle)  # rebuilt for the rank that holds it
        del middle  # now dead on every rank
        gc.collect()
    rpg.destroy_process_groups()
    report["second"] = spy.during(rpg.reload_process_groups)
    report["sums_second"] = [total(g, ctx.rank + 1) for g in (before, after)]
    return report


def test_a_group_dropped_on_one_rank_only_keeps_names_aligned() -> None:
    """Ranks agree on dead records before skipping them, or later groups get mismatched names."""
    reports = run_ranks(_asymmetric_drop, 2, timeout=120)
    for report in reports:
        assert report["sums"] == [3.0, 3.0]
        assert report["sums_second"] == [3.0, 3.0]
        assert report["second"] == 2, "a group dropped on every rank was rebuilt"
    assert reports[1]["first"] == 3
    assert reports[1]["middle_size"] == 2
