"""Who a stuck free waits for, at a world's size: what one stuck rank writes and reads.

When NCCL's destroy (an untimed barrier among a communicator's members) outlives its deadline,
each stuck rank writes which group it is stuck in and reads the others' (``frees._Context``,
``stuck_peers``)
to name the ranks that never came. At 4,096 ranks every survivor is stuck in WORLD's free at
once, so what each writes and reads must stay small: one short entry (a group's members as
arithmetic runs: a Megatron group is one run, whatever the world's size) and the entries read
once or twice, not every 0.2 s (before: each entry held the whole member list, about 23.5 kB
at 4,096 ranks, and every survivor read all of them 15 times in its grace: some 1.4 GB each).

The store is torch's ``HashStore`` behind a counting wrapper; the other stuck ranks' entries
are written by the same ``_find`` run in threads (64 ranks), or, at 4,096 ranks, through the
entry the code writes for them (the oracle is what one rank reads and concludes).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from reloadpg_autopatch.groups import frees, stuck_peers
from tests.support.stores import Forwarding

pytestmark = [pytest.mark.timeout(60)]

#: The grace, shortened: the other ranks are already there.
GRACE_S = 0.3


class Counting(Forwarding):
    """Counts each read of the stuck key (``get``, or ``compare_set``, which returns the value
    too) and the bytes it returned."""

    def __init__(self, inner: Any, key: str) -> None:
        super().__init__(inner)
        self.key, self.reads, self.read_bytes = key, 0, 0
        self.lock = threading.Lock()

    def _count(self, key: str, value: Any) -> Any:
        if key == self.key:
            with self.lock:
                self.reads += 1
                self.read_bytes += len(value)
        return value

    def get(self, key):
        return self._count(key, self.inner.get(key))

    def compare_set(self, key, expected, desired):
        return self._count(key, self.inner.compare_set(key, expected, desired))

    def append(self, key, value):
        self.inner.append(key, value)

    def has_extended_api(self):
        return True


def _context(store: Any, key: str, rank: int, label: str) -> Any:
    """A stuck free's context as the watchdog holds it (made without a process holder)."""
    ctx = frees._Context.__new__(frees._Context)
    ctx.label, ctx.store, ctx.key, ctx.rank = label, store, key, rank
    ctx.counter = f"{key}/count"
    return ctx


@pytest.fixture(autouse=True)
def _short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frees, "GRACE_S", GRACE_S)


def test_at_4096_ranks_a_stuck_rank_reads_the_entries_at_most_twice_and_few_bytes() -> None:
    import torch.distributed as dist

    world = list(range(4096))
    key = "rpg/destroy/1/stuck"
    store = Counting(dist.HashStore(), key)
    for rank in world[1:-1]:  # every survivor but rank 0 is already stuck in WORLD's free
        store.append(key, stuck_peers.entry(rank, "WORLD", world))
    found = _context(store, key, 0, "WORLD")._find(world)
    assert found == ([4095], {r: "WORLD" for r in world[1:-1]}), found[0]
    assert 1 <= store.reads <= 2, store.reads
    # One read is every entry once: a rank number, the label and one run, tens of bytes each.
    assert store.read_bytes <= 2 * 64 * len(world), store.read_bytes


def test_a_strided_group_is_one_run_and_reads_back_the_same() -> None:
    for ranks in ([0], [0, 1, 2, 3], list(range(3, 4096, 8)), [0, 1, 2, 5, 9, 13, 14], []):
        entry = stuck_peers.entry(7, "dp", ranks)
        assert len(entry) <= 64, (ranks[:5], len(entry))
        assert stuck_peers.read(entry) == {7: ("dp", ranks)}


@pytest.mark.parametrize(
    ("stuck_in", "missing"),
    [
        # Ranks 0-62 stuck in WORLD's free; rank 63 never came: every one names it.
        ({r: "WORLD" for r in range(63)}, [63]),
        # Rank 5 is stuck in an earlier free, the pair [5, 63]; rank 63 never came: those in
        # WORLD's free name 63 through 5 (not 5 itself: it said where it is stuck).
        ({**{r: "WORLD" for r in range(63) if r != 5}, 5: "pair"}, [63]),
    ],
)
def test_64_stuck_ranks_in_threads_name_the_one_that_never_came(stuck_in, missing) -> None:
    import torch.distributed as dist

    world = list(range(64))
    groups = {"WORLD": world, "pair": [5, 63]}
    key = "rpg/destroy/1/stuck"
    store = Counting(dist.HashStore(), key)
    results: dict[int, Any] = {}

    def stuck(rank: int) -> None:
        label = stuck_in[rank]
        results[rank] = _context(store, key, rank, label)._find(groups[label])

    threads = [threading.Thread(target=stuck, args=(r,)) for r in stuck_in]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(results) == sorted(stuck_in)
    for rank, (named, elsewhere) in results.items():
        assert named == missing, (rank, named)
        assert all(elsewhere[r] == stuck_in[r] for r in elsewhere), (rank, elsewhere)
    assert len(stuck_in) <= store.reads <= 2 * len(stuck_in), store.reads
