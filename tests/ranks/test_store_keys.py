"""The store does not grow with the cycles, in any mode, and a world's end leaves its peers
their last result (issue 33, item 3).

Oracles outside the package: the TCPStore server's own ``num_keys()``, read through a client of
the test's own; torch's ``ProcessGroup.shutdown`` counted by a spy installed in the rank; the
exception a rank raises. Every rank is a real gloo rank forked from the warm parent.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.ranks import GATE, Rank, run_ranks

pytestmark = pytest.mark.timeout(240)

# ---- the end of a world right after a reload ------------------------------------------------


def _end_right_after_reload(ctx: Rank) -> dict[str, Any]:
    """Rank 1 arrives first at the reload's agreement but waits for its result 2 s late; rank
    0, the last to arrive, ends WORLD as soon as its reload returns. No group is reloadable, so
    the agreement is the reload's last store round and nothing collective follows it."""
    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.groups import participants

    ctx.begin(timeout=6.0)
    oracle = dist.TCPStore(ctx.host, ctx.port, ctx.world_size, is_master=False)
    rpg.destroy_process_groups()
    dist.barrier()
    before = oracle.num_keys()
    dist.barrier()
    if ctx.rank == 1:
        real = participants.base_store

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

        participants.base_store = lambda: Late(real())
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
