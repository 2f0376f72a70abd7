"""Promises the mutation pass of issue 38 found undefended: a test each that fails on its break.

- On a WORLD store that cannot list its keys, the rounds' results still go: each round's last
  arriver deletes the previous round's result (docs/limitations.md, "the rounds' own keys still
  go"). Break: the last arriver skips it, and two result keys pile up per cycle.
- ``NCCL_DISABLE_MEM_MANAGER`` set to any value but ``0`` refuses suspend (NCCL reads it as set).
  Break: only ``1`` refuses, and NCCL's refused suspend would break the group.
- Native mode's handle exchange waits at most WORLD's timeout, not the group's own. Break: a
  dead member holds its peers for the group's timeout (40 s here, against 3 s).

Real gloo ranks activated by the gate; the oracles are outside the package: the TCPStore
server's own key listing (read through a client of the test's), the exception each rank raises,
and the clock. NCCL cannot run on CPU: the suspendable stand-in is registered for an
accelerator device only, as in ``tests/ranks/test_disagreeing_ranks.py``.
"""

from __future__ import annotations

import functools
import os
import time
from datetime import timedelta
from typing import Any

import pytest

from tests.support import accelerator
from tests.support.ranks import GATE, Rank, run_ranks, total

pytestmark = pytest.mark.timeout(180)

try:
    import torch.distributed as _dist

    ON_214 = hasattr(_dist.ProcessGroup, "reconfigure")
except ImportError:  # the start-up lane: these tests are skipped with the module
    ON_214 = False

CYCLES = 12


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
    for _ in range(CYCLES):
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


def test_the_rounds_results_go_on_a_store_that_cannot_list() -> None:
    """12 cycles on a WORLD store without ``list_keys``: the server holds as many round result
    keys after the last cycle as after the first (at most the last round's), where a break
    that keeps each round's predecessor adds two per cycle."""
    counts = run_ranks(_unlisted_store_cycles, 2, timeout=120, env=GATE)[0]
    assert counts[-1] == counts[0] <= 1, f"round result keys after each cycle: {counts}"


# ---- NCCL_DISABLE_MEM_MANAGER, whatever its spelling ---------------------------------------------


def _suspend_group_with(ctx: Rank, value: str) -> dict[str, Any]:
    """Suspend mode, ``NCCL_DISABLE_MEM_MANAGER=value`` on both ranks; one group over both on
    the accelerator stand-in."""
    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.tools import cpu_nccl as s

    os.environ["NCCL_DISABLE_MEM_MANAGER"] = value
    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    s.register()
    dist.Backend.register_backend(accelerator.ACCEL, accelerator.create, devices=[s.ACCELERATOR])
    rpg.set_reload_mode("suspend")
    rpg.set_memory_probe(s.memory_probe, device_types=("cpu", s.ACCELERATOR))
    rpg.set_memory_guard(0.0)
    ctx.init(timeout=10.0)
    try:
        group = dist.new_group([0, 1], backend=accelerator.MIXED)
    except Exception as error:
        return {"error": type(error).__name__, "message": str(error)}
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    return {"error": None, "sum": total(group, ctx.rank + 1)}


@pytest.mark.parametrize("value", ["1", "true", "yes", "2"])
def test_nccl_disable_mem_manager_set_any_way_is_refused_in_suspend_mode(value: str) -> None:
    """``NCCL_DISABLE_MEM_MANAGER`` set (``1``, ``true``, ``yes``, ``2``): suspend mode refuses
    the group at creation with ``ModeRefusedError`` naming the variable."""
    body = functools.partial(_suspend_group_with, value=value)
    for out in run_ranks(body, 2, timeout=60, env=GATE):
        assert out["error"] == "ModeRefusedError", out
        assert "NCCL_DISABLE_MEM_MANAGER" in out["message"], out


def test_nccl_disable_mem_manager_0_suspends() -> None:
    """``NCCL_DISABLE_MEM_MANAGER=0`` leaves NCCL's memory manager on: the group suspends and
    wakes, and works."""
    reports = run_ranks(functools.partial(_suspend_group_with, value="0"), 2, timeout=60, env=GATE)
    assert reports == [{"error": None, "sum": 3.0}] * 2, reports


# ---- native mode's handle exchange, bounded by WORLD's timeout ---------------------------------

#: WORLD's timeout, and the group's own: a wait bounded by the group's would last this long.
WORLD_S, GROUP_S = 3.0, 40.0


def _native_member_dies_before_the_handles(ctx: Rank) -> dict[str, Any]:
    """Native mode, WORLD's timeout 3 s, a group over both ranks created with a 40 s timeout;
    in the reload, rank 1 ends its process right after the reload's agreement, before the
    members exchange their reconfigure handles."""
    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.groups import agreement

    rpg.set_reload_mode("native")
    ctx.begin(timeout=WORLD_S)
    group = dist.new_group([0, 1], timeout=timedelta(seconds=GROUP_S))
    rpg.destroy_process_groups()
    if ctx.rank == 1:
        real = agreement.exchange

        def exchange(answers: Any) -> Any:
            merged = real(answers)
            if answers.STEP == "reload":
                os._exit(0)
            return merged

        agreement.exchange = exchange
    started = time.monotonic()
    try:
        rpg.reload_process_groups()
        error = None
    except Exception as caught:
        error = type(caught).__name__
    return {"error": error, "seconds": time.monotonic() - started, "group": str(group)}


@pytest.mark.skipif(not ON_214, reason="native mode reloads in place: torch 2.14's reconfigure")
def test_native_modes_handle_exchange_is_bounded_by_worlds_timeout() -> None:
    """A member dies before the handle exchange: its peer raises ``PeerMissingError`` within
    WORLD's timeout (3 s) and the round's end, far below the group's own 40 s."""
    reports = run_ranks(
        _native_member_dies_before_the_handles, 2, timeout=90, env=GATE, may_die=frozenset({1})
    )
    out = reports[0]
    assert out["error"] == "PeerMissingError", out
    assert out["seconds"] < WORLD_S + 6.0, out
