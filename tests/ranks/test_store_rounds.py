"""The store's rounds: what each one writes goes, and every rank takes part.

``sync``, ``agree`` and ``exchange``, chained as the lifecycle chains them, 15 times over on 4
thread ranks against one real server, leave its key count flat; the yes/no fields of an
agreement merge as "any rank says so"; a group released on one rank still gets the "created"
sync on every rank. Oracles: the server's ``num_keys()``, a store wrapper that logs every
operation a rank makes, and Python's ``any()``.
"""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest

from tests.support import this_tree
from tests.support.ranks import GATE, HOST, Rank, run_ranks

pytestmark = pytest.mark.timeout(300)


def _logging_store(inner: Any) -> Any:
    """A ``torch.distributed.Store`` forwarding to ``inner`` and logging ``(operation, key)``."""
    import torch.distributed as dist

    class Logging(dist.Store):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[tuple[str, str]] = []

        def _log(self, op: str, *keys: str) -> None:
            self.ops.extend((op, key) for key in keys)

        def set(self, key, value):
            self._log("set", key)
            inner.set(key, value)

        def get(self, key):
            self._log("get", key)
            return inner.get(key)

        def add(self, key, value):
            self._log("add", key)
            return inner.add(key, value)

        def compare_set(self, key, expected, desired):
            self._log("compare_set", key)
            return inner.compare_set(key, expected, desired)

        def wait(self, keys, timeout=None):
            self._log("wait", *keys)
            return inner.wait(keys) if timeout is None else inner.wait(keys, timeout)

        def check(self, keys):
            self._log("check", *keys)
            return inner.check(keys)

        def multi_get(self, keys):
            self._log("multi_get", *keys)
            return inner.multi_get(keys)

        def multi_set(self, keys, values):
            self._log("multi_set", *keys)
            inner.multi_set(keys, values)

        def delete_key(self, key):
            self._log("delete_key", key)
            return inner.delete_key(key)

        def num_keys(self):
            return inner.num_keys()

        def append(self, key, value):
            self._log("append", key)
            inner.append(key, value)

        def has_extended_api(self):
            return True

    return Logging()


# ---- the rounds driven by thread ranks -----------------------------------------------------------


def _rounds_body(port: int, n: int, rounds: int, line: threading.Barrier, out: dict) -> Any:
    """Rank bodies driving the package's rendezvous rounds as the lifecycle chains them."""
    import torch.distributed as dist

    from reloadpg_autopatch.groups.store import rounds as rendezvous

    def body(rank: int) -> list[bytes]:
        store = dist.TCPStore(HOST, port, 1, is_master=False, timeout=timedelta(seconds=30))
        answers = []
        previous = None
        for i in range(rounds):
            key = f"reloadpg_autopatch/{i + 1}/0/sync/point"
            rendezvous.sync(store, key, rank, n, timeout=20, step="p1 sync", previous=previous)
            previous = rendezvous.done_key(key)
            key = f"reloadpg_autopatch/{i + 1}/1/agreement"
            _token, merged = rendezvous.agree(
                store,
                key,
                rank,
                n,
                f"{rank}",
                merge=b",".join,
                timeout=20,
                step="p1 agree",
                previous=previous,
                token=True,
            )
            previous = rendezvous.done_key(key)
            handles = rendezvous.exchange(
                store,
                f"reloadpg_autopatch/{i + 1}/1/handles",
                rank,
                n,
                bytes([rank]) * 3,
                timeout=20,
                step="p1 exchange",
            )
            answers.append(merged + b"|" + b"".join(handles))
            line.wait(20)  # every rank has finished the round
            if rank == 0:
                out.setdefault("counts", []).append(store.num_keys())
            line.wait(20)  # counted before anybody starts the next round
        return answers

    return body


@pytest.mark.timeout(120)
def test_p1_store_key_count_stays_flat_over_many_rounds_driven_by_threads() -> None:
    """``sync``, ``agree`` (with the previous round's result to delete) and ``exchange``, 15
    times over on 4 thread ranks against one real server: its key count never grows."""
    import torch.distributed as dist

    server = dist.TCPStore(HOST, 0, 1, is_master=True, wait_for_workers=False)
    n, rounds = 4, 15
    line = threading.Barrier(n)
    out: dict[str, list[int]] = {}
    body = _rounds_body(server.port, n, rounds, line, out)
    results: dict[int, Any] = {}

    def run(rank: int) -> None:
        try:
            results[rank] = body(rank)
        except BaseException as error:  # the test looks at it
            results[rank] = error
            line.abort()

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert not any(t.is_alive() for t in threads), "a thread rank hung"
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    want = b"0,1,2,3|" + b"".join(bytes([r]) * 3 for r in range(n))
    assert all(r == [want] * rounds for r in results.values()), results
    counts = out["counts"]
    assert len(counts) == rounds
    assert counts == [counts[0]] * rounds, f"keys left behind by the rounds: {counts}"
    assert server.num_keys() == counts[0]


# ---- yes/no fields merge as "any rank says so"; a release on one rank still syncs ----------------


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_p2_merge_name_sets_booleans_are_true_if_any_rank_says_so(n: int) -> None:
    from reloadpg_autopatch.groups import agreement

    def entries(flags: list[bool]) -> list[bytes]:
        return [
            json.dumps({"held": [str(r)], "takes_part": flag, "short": []}).encode()
            for r, flag in enumerate(flags)
        ]

    cases = [[False] * n] + [[r == yes for r in range(n)] for yes in range(n)]
    cases.append([True] * n)
    for flags in cases:
        merged = agreement.expand_name_sets(agreement.merge_name_sets(entries(flags)))
        assert merged["takes_part"] is any(flags), (flags, merged)
        assert sorted(merged["held"]) == sorted(str(r) for r in range(n)), (flags, merged)


def _released_on_rank_1(ctx: Rank) -> dict:
    import torch.distributed as dist

    rpg = this_tree.package()
    assert rpg.is_patched()
    rpg.set_wrap_policy("all")
    inner = dist.TCPStore(
        HOST, ctx.port, ctx.world_size, is_master=False, timeout=this_tree.TIMEOUT
    )
    store = _logging_store(inner)
    dist.init_process_group(
        "gloo", store=store, rank=ctx.rank, world_size=ctx.world_size, timeout=this_tree.TIMEOUT
    )
    everyone = dist.new_group(list(range(ctx.world_size)))

    def created_sync_ops(start: int) -> list[str]:
        return [op for op, key in store.ops[start:] if "/sync/created/" in key]

    start = len(store.ops)
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    before = created_sync_ops(start)
    if ctx.rank == 1:
        dist.destroy_process_group(everyone)  # released here; the other ranks still hold it
    start = len(store.ops)
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    after = created_sync_ops(start)
    dist.destroy_process_group()
    return {"before": before, "after": after}


@pytest.mark.timeout(240)
def test_p2_a_group_released_on_one_rank_still_gets_the_created_sync_on_every_rank() -> None:
    """Rank 1 (in the middle of three) releases the group the others hold: at the next reload
    every rank, also those that released nothing, takes part in the "created" sync (an append,
    an add and a wait on its keys), which no reload had before the release."""
    reports = run_ranks(_released_on_rank_1, 3, timeout=200, env=GATE)
    for rank, report in enumerate(reports):
        assert report["before"] == [], (rank, report)
        assert {"append", "add", "wait"} <= set(report["after"]), (rank, report)
