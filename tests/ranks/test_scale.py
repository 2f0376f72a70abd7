"""Store traffic at scale: what each rank reads per cycle must not grow with the world.

Every training step pays one destroy and one reload on every rank, through one store. A black-
box oracle counts what each rank reads: a ``torch.distributed.Store`` subclass forwarding to the
launcher's ``TCPStore``, handed to ``init_process_group(store=...)``. torch's own group creations
(under the ``groups``/``world`` key prefixes) are counted apart: gloo's full mesh is torch's cost.
The rendezvous steps are also driven directly with threads on a real ``TCPStore``.
"""

from __future__ import annotations

import re
import threading
import time
from datetime import timedelta

import pytest

from tests.support.ranks import HOST, Rank, run_ranks

#: A key of ours: ``reloadpg_autopatch/<cycle>/<step n>/<kind>/...`` under torch's prefixes.
_OURS = re.compile(r"reloadpg_autopatch/\d+/\d+/([^/]+)/")


def _counting_store(inner):
    """A Store that forwards every call to ``inner`` and lists each key it reads, and the bytes."""
    from tests.support.stores import Forwarding

    class Counting(Forwarding):
        def __init__(self) -> None:
            super().__init__(inner)
            self.reads: list[str] = []
            #: Bytes each read returned, in step with ``reads`` (0 for waits and checks).
            self.sizes: list[int] = []

        def _read(self, keys, values=None):
            self.reads.extend(keys)
            self.sizes.extend([0] * len(keys) if values is None else [len(v) for v in values])
            return values

        def get(self, key):
            return self._read([key], [inner.get(key)])[0]

        def compare_set(self, key, expected, desired):
            return self._read([key], [inner.compare_set(key, expected, desired)])[0]

        def wait(self, keys, timeout=None):
            self._read(keys)
            return super().wait(keys, timeout)

        def check(self, keys):
            self._read(keys)
            return inner.check(keys)

        def multi_get(self, keys):
            return self._read(keys, inner.multi_get(keys))

    return Counting()


def _split(reads: list[str], sizes: list[int]) -> dict[str, int]:
    """Keys read: by our rendezvous, by torch creating groups under our prefixes, by others.

    ``ours_bytes``: what our rendezvous reads returned. Reading one key that holds every
    rank's entry is one read, so the count alone cannot tell an all-to-all from O(1).
    """
    out = {"ours": 0, "ours_bytes": 0, "creations": 0, "other": 0}
    for key, size in zip(reads, sizes, strict=True):
        found = _OURS.search(key)
        if found is None:
            out["other"] += 1
        elif found[1] in ("groups", "world"):
            out["creations"] += 1
        else:
            out["ours"] += 1
            out["ours_bytes"] += size
    return out


def _cycle_reads(ctx: Rank) -> dict:
    """Create a few groups over a registered WORLD; count the reads of destroy and reload."""
    import warnings

    import torch
    import torch.distributed as dist

    import reloadpg_autopatch

    warnings.simplefilter("ignore", FutureWarning)
    reloadpg_autopatch.monkey_patch_torch_dist()
    reloadpg_autopatch.set_wrap_policy("all")
    inner = dist.TCPStore(
        ctx.host, ctx.port, ctx.world_size, is_master=False, timeout=timedelta(seconds=60)
    )
    store = _counting_store(inner)
    dist.init_process_group(
        "gloo",
        store=store,
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=timedelta(seconds=60),
    )
    reloadpg_autopatch.register_default_process_group(accelerator_backends=("gloo",))
    pairs = [dist.new_group([r, r + 1]) for r in range(0, ctx.world_size, 2)]
    everyone = dist.new_group()
    held = [pairs[ctx.rank // 2], everyone]
    report = {}
    for cycle in range(2):
        before = len(store.reads)
        reloadpg_autopatch.destroy_process_groups()
        destroy = _split(store.reads[before:], store.sizes[before:])
        # The temporary WORLD still serves CPU collectives while the groups sleep.
        dist.barrier()
        t = torch.tensor([float(ctx.rank)])
        dist.broadcast(t, src=ctx.world_size - 1)
        before = len(store.reads)
        reloadpg_autopatch.reload_process_groups()
        reload = _split(store.reads[before:], store.sizes[before:])
        sums = []
        for group in held:
            s = torch.tensor([1.0])
            dist.all_reduce(s, group=group)
            sums.append(s.item())
        report[cycle] = {
            "destroy": destroy,
            "reload": reload,
            "broadcast": t.item(),
            "sums": sums,
        }
    dist.destroy_process_group()
    return report


@pytest.mark.timeout(300)
def test_reads_per_rank_of_a_cycle_do_not_grow_with_the_world() -> None:
    sizes = (2, 4)
    reports = {n: run_ranks(_cycle_reads, n, timeout=240) for n in sizes}
    for n, ranks in reports.items():
        for report in ranks:
            for cycle in report.values():
                assert cycle["broadcast"] == n - 1
                assert cycle["sums"] == [2.0, float(n)]

    def per_rank(n: int, step: str, what: str = "ours") -> list[int]:
        # The second cycle: the first one may pay one-off costs.
        return sorted(r[1][step][what] for r in reports[n])

    for step in ("destroy", "reload"):
        small, large = per_rank(2, step), per_rank(4, step)
        # One rank, the last to arrive, reads the N entries once; every other rank reads the
        # same few keys whatever N is. An all-to-all exchange reads N keys on every rank.
        assert large[:-1] == [small[0]] * (len(large) - 1), (step, small, large)
        assert large[-1] <= small[0] + 4, (step, small, large)
        assert sum(large) <= 2 * sum(small), (step, small, large)
        # And the same bytes: the merged answer (group names packed as runs) does not grow
        # with N, where every rank reading every entry would double them from 2 to 4 ranks.
        small, large = per_rank(2, step, "ours_bytes"), per_rank(4, step, "ours_bytes")
        assert large[:-1] == [large[0]] * (len(large) - 1), (step, small, large)
        assert large[0] <= small[0] + 16, (step, small, large)
    # The temporary WORLD connects lazily: a swap reads nothing that grows with N.
    creations = {n: sorted(r[1]["destroy"]["creations"] for r in reports[n]) for n in sizes}
    assert creations[4] == creations[2][:1] * 4, creations


# ---- the rendezvous steps on their own, ranks as threads ---------------------------------


def _server():
    import torch.distributed as dist

    return dist.TCPStore(HOST, 0, 1, is_master=True, wait_for_workers=False)


def _client(port: int):
    import torch.distributed as dist

    return dist.TCPStore(HOST, port, 1, is_master=False, timeout=timedelta(seconds=30))


def _threads(n: int, body) -> dict[int, object]:
    """Run ``body(rank)`` on ``n`` threads; their results (or exceptions) by rank."""
    results: dict[int, object] = {}

    def run(rank: int) -> None:
        try:
            results[rank] = body(rank)
        except BaseException as error:  # the test looks at it
            results[rank] = error

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


@pytest.mark.timeout(60)
def test_agree_gives_every_rank_the_same_answer_despite_skewed_arrival() -> None:
    from reloadpg_autopatch.groups.store import rounds

    server = _server()
    n = 6

    def body(rank: int) -> tuple[bytes, tuple[float, float], list[bytes]]:
        store = _client(server.port)
        time.sleep(0.05 * rank)  # rank 5 arrives a quarter second after rank 0
        arrived = time.monotonic()
        rounds.sync(store, "t/0/sync", rank, n, timeout=10, step="test: sync")
        synced = (arrived, time.monotonic())
        answer = rounds.agree(
            store,
            "t/0/agree",
            rank,
            n,
            f"r{rank}",
            merge=b",".join,
            timeout=10,
            step="test: agree",
        )
        handles = rounds.exchange(
            store, "t/0/h", rank, n, bytes([rank]) * rank, timeout=10, step="h"
        )
        return answer, synced, handles

    results = _threads(n, body)
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    answers = {r[0] for r in results.values()}
    assert answers == {b"r0,r1,r2,r3,r4,r5"}
    # Nobody left the barrier before the last rank reached it.
    assert min(r[1][1] for r in results.values()) >= max(r[1][0] for r in results.values())
    assert all(r[2] == [bytes([k]) * k for k in range(n)] for r in results.values())


@pytest.mark.timeout(60)
def test_a_rank_that_never_arrives_is_named_within_the_timeout() -> None:
    from reloadpg_autopatch.groups.store import rounds, stalled

    server = _server()
    n, absent, timeout = 4, 2, 1.5

    def body(rank: int):
        store = _client(server.port)
        started = time.monotonic()
        try:
            if rank % 2:  # a sync whose ranks read a token: the round's end wakes them
                rounds.sync(
                    store,
                    "reloadpg_autopatch/3/7/sync/reload",
                    rank,
                    n,
                    timeout=timeout,
                    step="reload: sync",
                    token=True,
                )
            else:
                rounds.agree(
                    store,
                    "reloadpg_autopatch/3/7/sync/reload",
                    rank,
                    n,
                    b"x",
                    merge=b"".join,
                    timeout=timeout,
                    step="reload: agreement",
                )
        except RuntimeError as error:
            return error, time.monotonic() - started
        return None, time.monotonic() - started

    results = _threads(n, lambda r: None if r == absent else body(r))
    for rank, outcome in results.items():
        if rank == absent:
            continue
        error, elapsed = outcome
        assert isinstance(error, rounds.RendezvousError), (rank, outcome)
        text = str(error)
        assert "ranks 2" in text, text
        assert "cycle 3, step 7" in text, text  # the key's cycle and step, which every rank shares
        assert ("reload: sync" if rank % 2 else "reload: agreement") in text, text
        assert error.missing == [absent]
        assert error.__cause__ is not None
        # The first rank to time out ends the round; every rank then has ``GRACE_S`` to say
        # it is alive before the missing are named.
        assert timeout - 0.1 <= elapsed <= timeout + stalled.GRACE_S + 1.5, elapsed


@pytest.mark.timeout(60)
def test_a_store_that_goes_away_is_reported_with_the_step() -> None:
    import torch.distributed as dist

    from reloadpg_autopatch.groups.store import rounds

    server = _server()
    store = dist.TCPStore(HOST, server.port, 1, is_master=False, timeout=timedelta(seconds=2))
    del server  # the rank hosting the store died
    time.sleep(0.2)
    with pytest.raises(rounds.RendezvousError) as caught:
        rounds.sync(
            store, "k", 0, 2, timeout=2, step="destroy: sync", cycle="epoch 0, generation 1"
        )
    text = str(caught.value)
    assert "destroy: sync" in text, text
    assert "epoch 0, generation 1" in text, text
    assert "unreachable" in text or "failed" in text, text
    assert caught.value.__cause__ is not None
