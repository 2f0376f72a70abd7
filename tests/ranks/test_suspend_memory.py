"""Memory in suspend mode: the reload's preflight, the cycle report, resident groups, pools.

A rank short of what a resume needs makes every rank refuse before any resume (its cache
emptied first), and a retry works and keeps its cycle's report; WORLD's out-of-memory resume is
a retryable ``MemoryShortError``; the cycle report gives what the backends and the pretend
device say; the destroy's report lists a resident group with its reason; a registered memory
pool is neither deregistered nor registered again.

The memory is the pretend device of ``reloadpg_autopatch/tools/cpu_nccl`` (CPU has none to
measure): its free bytes, and the stand-in's configured suspend and persistent bytes, are the
oracle, with the stand-in's call log and the exceptions raised.
"""

from __future__ import annotations

from typing import Any

import pytest

from reloadpg_autopatch.tools import cpu_nccl as suspendable
from tests.support import accelerator, suspend_ranks
from tests.support.ranks import Rank

pytestmark = pytest.mark.timeout(300)

MiB = 2**20
GiB = 2**30


# ---- memory preflight, and a retry ---------------------------------------------------------


#: The preflight's margin in the ranks (``set_memory_guard``), and each group's suspend bytes.
MARGIN_GB = 0.5
NEED = 2 * suspendable.MiB  # two groups of the stand-in's default 1 MiB each


def _preflight(ctx: Rank) -> dict[str, Any]:
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx, margin_gb=MARGIN_GB)
    groups = [dist.new_group([0, 1], backend=leg, group_desc=d) for d in ("tp", "dp")]
    free_before = s.device_memory()[0]
    rpg.destroy_process_groups()
    free_asleep = s.device_memory()[0]
    want = NEED + int(MARGIN_GB * GiB)
    # Rank 0 has exactly what a resume needs; rank 1 one MiB less.
    s.occupy(free_asleep - want + (MiB if ctx.rank == 1 else 0))
    out: dict[str, Any] = {"free": s.device_memory()[0], "need": want}
    seen = len(s.CALLS)
    out["first"] = suspend_ranks.outcome(rpg.reload_process_groups)
    out["first log"] = suspend_ranks.calls(s, seen)
    out["asleep"] = [
        suspend_ranks.outcome(lambda g=g: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))[0]
        for g in groups
    ]
    out["still suspended"] = [suspend_ranks.backend(g).memory_stats()["suspended"] for g in groups]
    s.occupy(None)
    seen = len(s.CALLS)
    out["retry"] = suspend_ranks.outcome(rpg.reload_process_groups)
    out["retry log"] = [(op, outcome) for _, op, _, outcome in suspend_ranks.calls(s, seen)]
    out["after"] = [
        suspend_ranks.outcome(lambda g=g: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))
        for g in groups
    ]
    report = rpg.last_cycle_report().to_dict()
    out["report destroy"] = report["destroy"] is not None
    out["driver_freed_bytes"] = (report["nccl"] or {}).get("driver_freed_bytes")
    out["measured freed"] = free_asleep - free_before
    return out


def test_a_rank_short_of_memory_makes_every_rank_refuse_then_a_retry_works() -> None:
    """Rank 1 lacks one MiB of what a resume needs (the groups' suspend bytes plus the memory
    guard's margin); rank 0 has exactly that. Every rank raises ``MemoryShortError`` with the
    same text, naming rank 1 (not rank 0), the device, its free bytes and the bytes needed; no
    resume reaches any backend, the groups stay refused and suspended. Freed, the retry
    resumes each group once and they give torch's sums."""
    ranks = suspend_ranks.run_once(_preflight)
    texts = {out["first"][1] for out in ranks}
    assert len(texts) == 1, texts
    text = texts.pop()
    shorty = ranks[1]
    for rank, out in enumerate(ranks):
        assert out["first"][0] == "MemoryShortError", out["first"]
        assert out["first log"] == [], (rank, out["first log"])
        assert out["asleep"] == ["GroupSuspendedError"] * 2
        assert out["still suspended"] == [1, 1]
        assert out["retry"] == ("ok", None), out["retry"]
        assert out["retry log"] == [("resume", "ok")] * 2, out["retry log"]
        assert out["after"] == [("ok", 3.0), ("ok", 3.0)]
    assert "rank 1 " in text, text
    assert "rank 0 " not in text, text
    assert " cpu " in text, text
    assert f"{shorty['free'] / MiB:.2f} MiB free" in text, (shorty["free"], text)
    assert f"needs {shorty['need'] / MiB:.2f} MiB" in text, (shorty["need"], text)


def test_a_retried_reload_keeps_the_report_of_its_cycle() -> None:
    """After a ``MemoryShortError`` and a successful retry, the cycle report is still the
    report of that cycle: its destroy is there, and the driver's freed bytes are what the
    pretend device gained during the destroy."""
    for rank, out in enumerate(suspend_ranks.run_once(_preflight)):
        assert out["report destroy"], f"rank {rank}: the retry dropped the destroy's report"
        assert out["driver_freed_bytes"] == out["measured freed"] == NEED, (rank, out)


# ---- the cycle report ----------------------------------------------------------------------


SIZES = {"tp": (3 * MiB, 1 * MiB), "dp": (5 * MiB, 2 * MiB)}  # (suspend, persist) bytes


def _report(ctx: Rank) -> dict[str, Any]:
    leg = suspend_ranks.leg()
    _, dist, rpg, s = suspend_ranks.start(ctx)
    names = {}
    for desc, (suspend, persist) in SIZES.items():
        s.configure(suspend_bytes=suspend, persist_bytes=persist)
        names[desc] = str(dist.new_group([0, 1], backend=leg, group_desc=desc).group_name)
    s.configure(uninitialized=True, suspend_bytes=7 * MiB)
    names["lazy"] = str(dist.new_group([0, 1], backend=leg, group_desc="lazy").group_name)
    s.configure()
    names["cpu"] = str(dist.new_group([0, 1], backend="gloo").group_name)
    free_before = s.device_memory()[0]
    rpg.destroy_process_groups()
    free_asleep = s.device_memory()[0]
    host_backup = s.host_backup_bytes()
    asleep = rpg.last_cycle_report().to_dict()
    rpg.reload_process_groups()
    return {
        "names": names,
        "measured freed": free_asleep - free_before,
        "host backup": host_backup,
        "back": s.device_memory()[0] == free_before,
        "asleep": asleep,
        "after": rpg.last_cycle_report().to_dict(),
    }


def test_the_cycle_report_gives_what_the_backends_and_the_device_say() -> None:
    """``last_cycle_report().to_dict()["nccl"]``: ``released_bytes`` is the stand-in's
    configured suspend bytes summed over the groups that suspended (not the one only guarded,
    nor the gloo one), ``resident_bytes`` their persistent bytes, the pinned-host estimate the
    host backups the stand-in holds while asleep, ``driver_freed_bytes`` (and ``freed_bytes``)
    what the pretend device gained during the destroy; per group ``stats_before`` /
    ``stats_asleep`` / ``stats_after`` say 0, 1 and 0 suspended, and the calls took time."""
    for rank, out in enumerate(suspend_ranks.run_once(_report)):
        names, after = out["names"], out["after"]
        nccl = after["nccl"]
        released = sum(suspend for suspend, _ in SIZES.values())
        assert out["measured freed"] == released, out["measured freed"]  # the oracle itself
        assert out["back"], "the resume did not give the pretend device its bytes back"
        assert nccl["released_bytes"] == released, (rank, nccl)
        assert nccl["resident_bytes"] == sum(persist for _, persist in SIZES.values())
        assert nccl["pinned_host_bytes_estimate"] == out["host backup"] == released
        assert nccl["driver_freed_bytes"] == after["freed_bytes"] == out["measured freed"]
        assert out["asleep"]["nccl"]["driver_freed_bytes"] == out["measured freed"]
        assert names["cpu"] not in nccl["groups"]
        for desc, (suspend, persist) in SIZES.items():
            group = nccl["groups"][names[desc]]
            want = {"suspend": suspend, "persist": persist, "total": suspend + persist}
            assert group["stats_before"] == {**want, "suspended": 0}, (desc, group)
            assert group["stats_asleep"] == {**want, "suspended": 1}, (desc, group)
            assert group["stats_after"] == {**want, "suspended": 0}, (desc, group)
            assert group["suspend_ms"] > 0, group
            assert group["resume_ms"] > 0, group
        lazy = nccl["groups"].get(names["lazy"])
        assert lazy is None or (lazy["legs"] == [] and lazy["suspend_ms"] == 0), lazy


# ---- memory pools -------------------------------------------------------------------------


def _pools(ctx: Rank) -> dict[str, Any]:
    from reloadpg_autopatch.tools import cpu_nccl as s

    calls: list[tuple[str, int, int]] = []

    def register_mem_pool(self: Any, pool: Any, symm: bool = False) -> None:
        calls.append(("register", id(self), id(pool)))

    def deregister_mem_pool(self: Any, pool: Any) -> None:
        calls.append(("deregister", id(self), id(pool)))

    classes = [s.SuspendableGloo, *([s.SuspendablePy] if s.python_backend_available() else [])]
    for cls in classes:  # before any group exists, as Megatron's allocator would find them
        cls.register_mem_pool = register_mem_pool
        cls.deregister_mem_pool = deregister_mem_pool
    leg = suspend_ranks.leg()
    torch, dist, rpg, _ = suspend_ranks.start(ctx)
    group = dist.new_group([0, 1], backend=leg, group_desc="tp")
    backend = suspend_ranks.backend(group)
    pool = object()
    backend.register_mem_pool(pool, symm=True)
    out: dict[str, Any] = {"at registration": list(calls), "cycles": []}
    for _ in range(3):
        del calls[:]
        rpg.destroy_process_groups()
        destroy = list(calls)
        del calls[:]
        rpg.reload_process_groups()
        out["cycles"].append(
            {
                "destroy": destroy,
                "reload": list(calls),
                "same backend": suspend_ranks.backend(group) is backend,
                "sum": suspend_ranks.rank_sum(dist, torch, ctx.rank, group),
            }
        )
    out["ids"] = (id(backend), id(pool))
    return out


def test_a_registered_memory_pool_is_neither_deregistered_nor_registered_again() -> None:
    """A pool registered through a suspend-mode group's backend stays registered: the
    communicator is suspended, not destroyed, so no destroy deregisters it and no reload
    registers it again; the backend the group hands out is the same object every cycle."""
    for rank, out in enumerate(suspend_ranks.run_once(_pools)):
        backend, pool = out["ids"]
        assert out["at registration"] == [("register", backend, pool)], out["at registration"]
        for n, cycle in enumerate(out["cycles"], start=1):
            assert cycle == {"destroy": [], "reload": [], "same backend": True, "sum": 3.0}, (
                rank,
                n,
                cycle,
            )


# ---- the preflight empties the cache before it refuses ("collecting garbage and emptying
# the allocator's cache when short") ------------------------------------------------------------


def _cleared_then_resumed(ctx: Rank) -> dict[str, Any]:
    """Every rank is short of what its resume needs until the cache is emptied: the probe's
    ``clear`` gives the memory back, so the reload resumes without a ``MemoryShortError``."""
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx)
    group = dist.new_group([0, 1], backend=leg, group_desc="tp")
    cleared: list[str] = []

    def clear(device: Any) -> None:
        cleared.append(str(device))
        s.occupy(None)  # what emptying the allocator's cache gives back

    rpg.set_memory_probe(s.memory_probe, device_types=("cpu", s.ACCELERATOR), clear=clear)
    rpg.destroy_process_groups()
    s.occupy(s.device_memory()[0])  # nothing free: short of the resume's need
    out: dict[str, Any] = {"free when short": s.device_memory()[0]}
    out["reload"] = suspend_ranks.outcome(rpg.reload_process_groups)
    out["cleared"] = cleared
    out["sum"] = suspend_ranks.outcome(lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, group))
    return out


def test_a_rank_short_of_memory_empties_the_cache_and_then_resumes() -> None:
    for rank, out in enumerate(suspend_ranks.run_once(_cleared_then_resumed)):
        assert out["free when short"] == 0, (rank, out)
        assert out["cleared"], f"rank {rank}: the preflight never emptied the cache: {out}"
        assert out["reload"] == ("ok", None), (rank, out["reload"])
        assert out["sum"] == ("ok", 3.0), (rank, out["sum"])


# ---- the destroy step's report ("lists the groups suspended, guarded and resident (with the
# reason)") --------------------------------------------------------------------------------------


def _resident(ctx: Rank) -> dict[str, Any]:
    """Rank 1 releases ``h`` before the destroy: on rank 0 it stays resident, and the
    destroy's report says so, with the reason."""
    leg = suspend_ranks.leg()
    torch, dist, rpg, _s = suspend_ranks.start(ctx)
    g = dist.new_group([0, 1], backend=leg, group_desc="kept")
    h = dist.new_group([0, 1], backend=leg, group_desc="released")
    names = {"g": str(g.group_name), "h": str(h.group_name)}
    if ctx.rank == 1:
        dist.destroy_process_group(h)
    rpg.destroy_process_groups()
    groups = rpg.last_cycle_report().to_dict()["destroy"]["groups"]
    rpg.reload_process_groups()
    return {"names": names, "groups": groups, "g": suspend_ranks.rank_sum(dist, torch, ctx.rank, g)}


def test_the_destroy_report_lists_a_resident_group_with_its_reason() -> None:
    out = suspend_ranks.run_once(_resident)[0]
    assert out["groups"].get("suspended") == [out["names"]["g"]], out
    assert out["groups"].get("resident") == [f"{out['names']['h']} (resident)"], out
    assert out["g"] == 3.0, out


# ---- the memory preflight counts WORLD ---------------------------------------------------------


def _world_short_of_memory(ctx: Rank) -> dict[str, Any]:
    torch, dist, rpg, s = accelerator.start(ctx, "suspend", world=suspendable.NAME_A)
    rpg.register_default_process_group()
    rpg.destroy_process_groups()
    # Short of WORLD's need by half a MiB (WORLD is the only group that sleeps).
    s.occupy(s.device_memory()[0] - MiB + MiB // 2)
    seen = len(s.CALLS)
    try:
        rpg.reload_process_groups()
        out: dict[str, Any] = {"first": ("ok", "")}
    except Exception as error:
        out = {"first": (type(error), str(error))}
    out["first log"] = [c.op for c in s.CALLS[seen:] if c.op in ("suspend", "resume")]
    s.occupy(None)
    out["retry"] = accelerator.outcome(rpg.reload_process_groups)
    out["sum"] = accelerator.rank_sum(dist, torch, ctx.rank)
    return out


@pytest.mark.timeout(240)
def test_an_out_of_memory_resume_of_world_is_a_retryable_memory_short_error() -> None:
    """WORLD registered in suspend mode (on the stand-in) sleeps; the pretend device then lacks
    half a MiB of its 1 MiB need. The reload raises ``MemoryShortError`` (retryable) before any
    resume reaches the backend, never ``GroupBrokenError``; with the memory back, the retry
    resumes WORLD and it gives torch's sum."""
    import reloadpg_autopatch as rpg

    for rank, out in enumerate(accelerator.run_once(_world_short_of_memory)):
        assert out["first"][0] is rpg.MemoryShortError, (rank, out["first"])
        assert out["first log"] == [], (rank, out["first log"])
        assert out["retry"] == ("ok", None), (rank, out["retry"])
        assert out["sum"] == 3.0
