"""The store does not grow with the cycles, in any mode, and a world's end leaves its peers
their last result (issue 33, item 3).

The rounds' keys go with their round (each deleted by its last reader) and torch's own keys of
the groups it creates are swept at the next cycle; on a store that cannot list its keys, the
rounds' results still go (docs/limitations.md); a Python ``Store`` under torch's
``PrefixStore``, a gloo WORLD that stays awake, and a new world on a store a crashed world used
keep the count flat.

Oracles outside the package: the TCPStore server's own ``num_keys()`` and ``list_keys()``, read
through a client of the test's own; torch's ``ProcessGroup.shutdown`` counted by a spy installed
in the rank; the exception a rank raises. A Python ``Store`` subclass cannot observe deletes
(torch's ``PrefixStore`` over one raises "pure virtual function deleteKey"), so key counts are
read from a real server.
"""

from __future__ import annotations

import os
import re
import time
from datetime import timedelta
from typing import Any

import pytest

from tests.support import this_tree
from tests.support.ranks import GATE, HOST, Rank, run_ranks, total

pytestmark = pytest.mark.timeout(240)

try:
    import torch.distributed as _dist

    ON_214 = hasattr(_dist.ProcessGroup, "reconfigure")
except ImportError:  # the start-up lane: these tests are skipped with the module
    ON_214 = False

# ---- fifty cycles in every mode; a gloo WORLD stays awake ----------------------------------------


CYCLES = 50
#: (mode, how WORLD is registered): ``swap``: named in accelerator_backends, swapped for a
#: temporary WORLD on destroy; ``plain``: a gloo WORLD as a program registers it.
SETUPS = [
    ("wrapper", "swap"),
    ("wrapper", "plain"),
    ("auto", "plain"),
    ("suspend", "plain"),
    pytest.param(
        "native",
        "plain",
        marks=pytest.mark.skipif(not ON_214, reason="native mode needs torch 2.14"),
    ),
]


def _cycles(ctx: Rank) -> dict[str, Any]:
    """``CYCLES`` cycles of three groups; rank 0 counts the server's keys after each one, and
    every rank counts torch's shutdowns of WORLD (a reconfigure in place starts with one)."""
    import torch
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    shutdowns: list[int] = []
    real = dist.ProcessGroup.shutdown

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self is dist.distributed_c10d._world.default_pg:
            shutdowns.append(1)
        return real(self, *args, **kwargs)

    dist.ProcessGroup.shutdown = counted
    from reloadpg_autopatch.groups.store import sweep as store_sweep

    sweeps: list[int] = []  # the sweep of other cycles' keys: once a world, on WORLD's rank 0
    real_sweep = store_sweep.sweep

    def counted_sweep(*args: Any, **kwargs: Any) -> int:
        sweeps.append(1)
        return real_sweep(*args, **kwargs)

    store_sweep.sweep = counted_sweep
    how = os.environ["KEYS_TEST_WORLD"]
    ctx.begin(world=True, swap=("gloo",) if how == "swap" else None)
    groups = [dist.new_group([0, 1]) for _ in range(3)]
    oracle = dist.TCPStore(ctx.host, ctx.port, ctx.world_size, is_master=False)
    counts = []
    for _ in range(CYCLES):
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        for group in groups:
            t = torch.ones(1)
            dist.all_reduce(t, group=group)
            assert t.item() == 2.0
        dist.barrier()  # every rank is through its reload
        counts.append(oracle.num_keys() if ctx.rank == 0 else None)
        dist.barrier()  # nobody starts the next cycle before rank 0 counted
    return {"counts": counts, "world shutdowns": len(shutdowns), "sweeps": len(sweeps)}


@pytest.mark.parametrize(("mode", "world"), SETUPS)
def test_the_store_key_count_stays_flat_over_fifty_cycles(mode: str, world: str) -> None:
    """50 cycles of WORLD and three groups: the server holds as many keys after the last cycle
    as after the first (each rank deletes what its creations wrote once every rank has passed
    the next cycle's first round; WORLD's rank 0 sweeps the store once, at the world's first
    destroy). Up to 15 s: 50 cycles are what makes growth unmistakable."""
    env = {**GATE, "SLIME_RELOADABLE_PG_MODE": mode, "KEYS_TEST_WORLD": world}
    results = run_ranks(_cycles, 2, timeout=200, env=env)
    counts = results[0]["counts"]
    assert len(counts) == CYCLES
    assert counts[1:] == [counts[1]] * (CYCLES - 1), f"keys after each cycle: {counts}"
    assert [r["sweeps"] for r in results] == [1, 0]  # at the world's first destroy, on rank 0


@pytest.mark.parametrize("mode", ["suspend", "auto"])
def test_a_gloo_world_that_stays_awake_is_never_shut_down(mode: str) -> None:
    """A plain gloo WORLD in suspend and auto modes stays awake, as gloo groups do: torch's
    ``shutdown`` is never called on it (torch 2.14 could reconfigure it in place)."""
    env = {**GATE, "SLIME_RELOADABLE_PG_MODE": mode, "KEYS_TEST_WORLD": "plain"}
    results = run_ranks(_cycles, 2, timeout=200, env=env)
    assert [r["world shutdowns"] for r in results] == [0, 0]


# ---- the end of a world right after a reload ------------------------------------------------


def _end_right_after_reload(ctx: Rank) -> dict[str, Any]:
    """Rank 1 arrives first at the reload's agreement but waits for its result 2 s late; rank
    0, the last to arrive, ends WORLD as soon as its reload returns. No group is reloadable, so
    the agreement is the reload's last store round and nothing collective follows it."""
    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.groups.store import channel

    ctx.begin(timeout=6.0)
    oracle = dist.TCPStore(ctx.host, ctx.port, ctx.world_size, is_master=False)
    rpg.destroy_process_groups()
    dist.barrier()
    before = oracle.num_keys()
    dist.barrier()
    if ctx.rank == 1:
        real = channel.base_store

        class Late:
            """The store, with a wait that starts 2 s late for the reload's result."""

            def __init__(self, inner: Any) -> None:
                self.inner = inner

            def __getattr__(self, name: str) -> Any:
                return getattr(self.inner, name)

            def wait(self, keys: list[str], *args: Any) -> Any:
                if any(k.endswith("/agreement/done") for k in keys):
                    time.sleep(2.0)
                return self.inner.wait(keys, *args)

        channel.base_store = lambda: Late(real())
    else:
        time.sleep(0.5)  # rank 1 has counted in: rank 0 is the last to arrive
    said: dict[str, Any] = {}
    try:
        rpg.reload_process_groups()
        said["reloaded"] = True
    except Exception as error:
        said["error"] = f"{type(error).__name__}: {error}"
    dist.destroy_process_group()
    time.sleep(2.5 if ctx.rank == 0 else 0.0)  # rank 1 has ended its world too
    said["keys left"] = oracle.num_keys() - before
    return said


def test_ending_the_world_right_after_a_reload_leaves_a_late_peer_its_result() -> None:
    """The fast rank ends WORLD while its peer has not yet read the reload's result: the peer
    still reloads (it used to wait WORLD's timeout and raise ``PeerMissingError``), and once
    both worlds ended the store holds no more keys than before the reload."""
    results = run_ranks(_end_right_after_reload, 2, timeout=60, env=GATE)
    assert [r.get("error") for r in results] == [None, None], results
    assert results[0]["keys left"] <= 0, results


# ---- a Python Store under torch's PrefixStore ---------------------------------------------------


def _python_store_cycles(ctx: Rank) -> list[int]:
    """WORLD initialized on a Python ``Store`` subclass (a custom store, complete: it lists and
    deletes keys), which torch puts under a ``PrefixStore`` of WORLD's name; 20 cycles of three
    groups; rank 0 counts the server's keys after each."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    inner = dist.TCPStore(ctx.host, ctx.port, ctx.world_size, is_master=False)

    from tests.support.stores import Forwarding

    assert rpg.is_patched()
    store = Forwarding(inner)
    dist.init_process_group(
        "gloo", store=store, rank=ctx.rank, world_size=ctx.world_size, timeout=timedelta(seconds=30)
    )
    groups = [dist.new_group([0, 1]) for _ in range(3)]
    counts = []
    for _ in range(20):
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        for group in groups:
            t = torch.ones(1)
            dist.all_reduce(t, group=group)
        dist.barrier()
        counts.append(inner.num_keys() if ctx.rank == 0 else None)
        dist.barrier()
    return counts


def test_a_python_store_under_torchs_prefix_store_keeps_the_key_count_flat() -> None:
    """torch's ``PrefixStore`` cannot delete through a Python ``Store`` (its trampoline does
    not forward ``delete_key``): the package deletes through the inner store, under WORLD's
    prefix, so rounds and creations leave nothing behind there either."""
    counts = run_ranks(_python_store_cycles, 2, timeout=120, env=GATE)[0]
    assert counts[1:] == [counts[1]] * 19, f"keys after each cycle: {counts}"


# ---- what a crashed world left on a reused store ----------------------------------------------

#: Keys a world that crashed in its seventh cycle leaves: a round's entries and counter, and the
#: creation keys of a group it was creating again.
CRASHED = [
    "reloadpg_autopatch/7/1/agreement/arrived",
    "reloadpg_autopatch/7/1/agreement/count",
    "reloadpg_autopatch/7/1/groups/0123456789abcdef//1//cpu//0/0",
]


def _after_a_crash(ctx: Rank) -> dict[str, Any]:
    """The store holds ``CRASHED`` (written through WORLD's own store, where the crashed world's
    rounds wrote them) before this world's first cycle; rank 0 then checks which remain."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch as rpg

    ctx.begin()
    store = c10d._get_default_store()
    if ctx.rank == 0:
        for key in CRASHED:
            store.set(key, b"x")
    dist.barrier()
    group = dist.new_group([0, 1])
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    dist.barrier()
    left = [key for key in CRASHED if store.check([key])]
    dist.barrier()
    assert group is not None
    return {"left": left}


def test_a_new_world_deletes_what_a_crashed_world_left_on_its_store() -> None:
    """Keys of ours from another cycle, left by a world that crashed on the same store, are
    gone after the new world's first cycle (the store's own ``check()``)."""
    results = run_ranks(_after_a_crash, 2, timeout=60, env=GATE)
    assert [r["left"] for r in results] == [[], []], results


# ---- the keys of a round go with the round, and torch's are swept --------------------------------


#: A key of the package's rendezvous: ``reloadpg_autopatch/<cycle>/<step>/<kind>/...``. Under
#: ``groups`` and ``world`` it is torch creating groups (gloo's own keys, never deleted by torch).
_KEY = re.compile(r"reloadpg_autopatch/\d+/\d+/([^/]+)/")


def _is_round_key(key: str) -> bool:
    found = _KEY.search(key)
    return found is not None and found[1] not in ("groups", "world")


def _keys_over_cycles(ctx: Rank) -> dict:
    rpg, dist = this_tree.begin(ctx, world=True)
    # The launcher's server, as its own client sees it: ``list_keys()`` is the server's answer.
    server = dist.TCPStore(
        HOST, ctx.port, ctx.world_size, is_master=False, timeout=this_tree.TIMEOUT
    )
    pair, spare = dist.new_group([0, 1]), dist.new_group([0, 1])
    dist.barrier()
    rounds, torchs, sums = [], [], []
    for cycle in range(8):
        if cycle == 3 and ctx.rank == 1:
            dist.destroy_process_group(spare)  # from now on every reload has a created sync
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        sums.append(total(pair, 1.0))
        dist.barrier()  # every rank has returned from the reload: every round is over
        keys = server.list_keys()
        rounds.append(sorted(k for k in keys if _is_round_key(k)))
        torchs.append(len(keys) - len(rounds[-1]))
        dist.barrier()  # nobody starts the next round before rank 0 has counted
    dist.destroy_process_group()
    return {"rounds": rounds, "torchs": torchs, "sums": sums}


@pytest.mark.timeout(240)
def test_p1_store_key_count_stays_flat_over_destroy_reload_cycles_of_real_ranks() -> None:
    """The server holds as many of the package's round keys after the eighth cycle as after
    the first (each round's keys are deleted by its last reader), and torch's own keys for
    the groups it creates do not grow either (swept at the next cycle's first round; before
    that sweep they grew every cycle, which this oracle saw)."""
    reports = run_ranks(_keys_over_cycles, 2, timeout=200, env=GATE)
    counts = [len(keys) for keys in reports[0]["rounds"]]
    torchs = reports[0]["torchs"]
    assert all(r["sums"] == [2.0] * 8 for r in reports), reports
    assert counts == [counts[0]] * len(counts), ("the rounds' keys pile up", reports[0]["rounds"])
    # One key: the last round's result, which the next round's last arriver deletes.
    assert counts[0] == 1, reports[0]["rounds"]
    assert max(torchs[1:]) <= torchs[1], torchs


# ---- fifty cycles in every mode; a gloo WORLD stays awake ----------------------------------------


UNLISTED_CYCLES = 12


# ---- the rounds' results on a store that cannot list --------------------------------------------


def _unlisted_store_cycles(ctx: Rank) -> list[int | None]:
    """WORLD on a Python store without ``list_keys`` (so the package's sweep of other cycles'
    keys cannot run); ``CYCLES`` cycles of two groups; rank 0 counts the rounds' result keys
    the server holds after each cycle, through a TCPStore client of its own."""
    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from tests.support.stores import Forwarding

    class Unlisted(Forwarding):
        """A program's own store, written without ``list_keys``."""

        def list_keys(self) -> list[str]:
            raise RuntimeError("this store cannot list its keys")

    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    rpg.set_wrap_policy("all")
    inner = dist.TCPStore(ctx.host, ctx.port, ctx.world_size, is_master=False)
    store = Unlisted(inner)  # referenced here: torch's PrefixStore holds only its C++ side
    dist.init_process_group(
        "gloo",
        store=store,
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=timedelta(seconds=30),
    )
    groups = [dist.new_group([0, 1]) for _ in range(2)]
    oracle = dist.TCPStore(ctx.host, ctx.port, ctx.world_size, is_master=False)
    counts: list[int | None] = []
    for _ in range(UNLISTED_CYCLES):
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        assert [total(g, 1.0) for g in groups] == [2.0, 2.0]
        dist.barrier()  # every rank has read every round's result
        if ctx.rank == 0:
            keys = oracle.list_keys()
            counts.append(
                sum(1 for k in keys if "reloadpg_autopatch/" in k and k.endswith("/done"))
            )
        else:
            counts.append(None)
        dist.barrier()
    return counts


@pytest.mark.timeout(180)
def test_the_rounds_results_go_on_a_store_that_cannot_list() -> None:
    """12 cycles on a WORLD store without ``list_keys``: the server holds as many round result
    keys after the last cycle as after the first (at most the last round's), where a break
    that keeps each round's predecessor adds two per cycle."""
    counts = run_ranks(_unlisted_store_cycles, 2, timeout=120, env=GATE)[0]
    assert counts[-1] == counts[0] <= 1, f"round result keys after each cycle: {counts}"
