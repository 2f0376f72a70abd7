"""The CPU model of NCCL's suspend (``reloadpg_autopatch/tools/cpu_nccl``) against NCCL's protocol.

No GPU exists where this suite runs, so the package's suspend mode is tested against a stand-in
for an NCCL communicator: ``reloadpg_autopatch/tools/cpu_nccl``, on gloo. These tests prove that the
stand-in is faithful to what torch and NCCL do, as their sources say (``docs/suspend-facts.md``:
the four stats keys; suspend and resume as barriers; invalid usage
raised before the barrier; the lazy-init, unsupported, hang, failure and memory cases), so
that a package test that passes against it means something.

Every case runs on two gloo ranks, for each variant: A (``"suspendable"``, a
``ProcessGroupGloo`` subclass, both torch lanes) and B (``"suspendable_py"``, a pure-Python
``Backend``, torch 2.14 only; skipped on 2.13, where Python cannot construct a ``Backend``).
The oracles are independent of the stand-in's own bookkeeping where that is possible: the
clock around the barriers, the values collectives return, the exception a call raises and how
soon, ``torch.distributed``'s own ``_get_backend``, and the package's memory query.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import Any

import pytest

from reloadpg_autopatch.tools import cpu_nccl as suspendable
from tests.support.ranks import Rank, run_ranks

pytestmark = pytest.mark.timeout(240)

B_AVAILABLE = suspendable.python_backend_available()
needs_b = pytest.mark.skipif(not B_AVAILABLE, reason=suspendable.PYTHON_BACKEND_REASON)
VARIANTS = [
    pytest.param(suspendable.NAME_A, id="A"),
    pytest.param(suspendable.NAME_B, id="B", marks=needs_b),
]
MiB = 2**20
#: A run's deadline.
DEADLINE = 150.0


def _has_pre_hooks() -> bool:
    import torch.distributed as dist

    return hasattr(dist.ProcessGroup, "register_pre_hook")


# ---- what the ranks share --------------------------------------------------------------------


def _start(ctx: Rank, world: str = "gloo") -> tuple[Any, Any, Any]:
    """Join WORLD; return (torch, torch.distributed, the suspendable module)."""
    import warnings

    import torch
    import torch.distributed as dist

    from reloadpg_autopatch.tools import cpu_nccl as s

    warnings.simplefilter("ignore", FutureWarning)
    ctx.init(backend=world)
    return torch, dist, s


def _group(name: str, **switches: Any) -> tuple[Any, Any]:
    """A new group on ``name`` with ``switches`` for its backend; (group, Python backend)."""
    import torch
    import torch.distributed as dist

    from reloadpg_autopatch.tools import cpu_nccl as s

    s.configure(**switches)
    try:
        group = dist.new_group([0, 1], backend=name)
    finally:
        s.configure()
    return group, group._get_backend(torch.device("cpu"))


def _sum(group: Any, value: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value])
    dist.all_reduce(t, group=group)
    return t.item()


def _raises(call: Any) -> tuple[str, str, float]:
    """Run ``call``; (exception class name, message, seconds it took). ("", "", s) if none."""
    start = time.monotonic()
    try:
        call()
    except Exception as error:
        return type(error).__name__, str(error), time.monotonic() - start
    return "", "", time.monotonic() - start


def _timed(call: Any) -> float:
    start = time.monotonic()
    call()
    return time.monotonic() - start


# ---- stats, memory, the creator -------------------------------------------------------------


def _cycle(ctx: Rank, name: str) -> dict[str, Any]:
    torch, _dist, s = _start(ctx)
    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.groups import memory

    rpg.set_memory_probe(s.memory_probe, device_types=("cpu",))
    cpu = torch.device("cpu")
    made = s.creations(name)
    group, backend = _group(name, suspend_bytes=3 * MiB, persist_bytes=MiB // 2)
    out: dict[str, Any] = {
        "made by new_group": s.creations(name) - made,
        "type": type(backend).__name__,
        "is the module's object": backend is s.backends(name)[-1],
    }
    made = s.creations(name)
    stats, free, probed, backups, sums = [], [], [], [], []
    for _ in range(3):
        stats.append(backend.memory_stats())
        free.append(s.device_memory()[0])
        probed.append(memory.figures(cpu).free)
        backend.suspend()
        stats.append(backend.memory_stats())
        free.append(s.device_memory()[0])
        probed.append(memory.figures(cpu).free)
        backups.append(s.host_backup_bytes())
        backend.resume()
        sums.append(_sum(group, ctx.rank + 1.0))
    stats.append(backend.memory_stats())
    out.update(
        stats=stats,
        free=free,
        probed=probed,
        backups=backups,
        after=s.host_backup_bytes(),
        sums=sums,
        intact=backend.buffer_intact(),
        made_by_cycles=s.creations(name) - made,
        figures_type=type(memory.figures(cpu)).__name__,
    )
    return out


@pytest.mark.parametrize("name", VARIANTS)
def test_stats_memory_and_the_creator_across_cycles(name: str) -> None:
    for out in run_ranks(partial(_cycle, name=name), 2, timeout=DEADLINE):
        assert out["made by new_group"] == 1
        assert out["type"] == ("SuspendableGloo" if name == suspendable.NAME_A else "SuspendablePy")
        assert out["is the module's object"]
        awake = {
            "suspend": 3 * MiB,
            "suspended": 0,
            "persist": MiB // 2,
            "total": 3 * MiB + MiB // 2,
        }
        asleep = {**awake, "suspended": 1}  # "suspend" is not decremented by a suspend
        assert out["stats"] == [awake, asleep] * 3 + [awake]
        assert all(set(s) == {"suspend", "suspended", "persist", "total"} for s in out["stats"])
        free = out["free"]
        assert [b - a for a, b in zip(free[::2], free[1::2], strict=False)] == [3 * MiB] * 3
        assert len(set(free[::2])) == 1  # every resume took the bytes back
        assert out["probed"] == free  # the package's memory query sees the same figures
        assert out["figures_type"] == "MemoryFigures"
        assert out["backups"] == [3 * MiB] * 3
        assert out["after"] == 0
        assert out["sums"] == [3.0] * 3  # the group still computes after each resume
        assert out["intact"]
        assert out["made_by_cycles"] == 0  # a cycle creates nothing


def _sizes_from_the_environment(ctx: Rank) -> dict[str, Any]:
    _, _, s = _start(ctx)
    _, backend = _group(s.NAME_A)
    return {"stats": backend.memory_stats(), "unsupported": backend.settings.unsupported}


def test_environment_switches_select_ranks() -> None:
    env = {"SUSPENDABLE_BYTES": f"{2 * MiB}@1", "SUSPENDABLE_UNSUPPORTED": "split_share@*"}
    zero, one = run_ranks(_sizes_from_the_environment, 2, timeout=DEADLINE, env=env)
    assert zero["stats"]["suspend"] == MiB
    assert one["stats"]["suspend"] == 2 * MiB
    assert zero["unsupported"] == one["unsupported"] == "split_share"


def _variant(ctx: Rank, name: str) -> dict[str, Any]:
    import os

    torch, dist, s = _start(ctx)
    cls = s.SuspendableGloo if name == s.NAME_A else s.SuspendablePy
    variant = s.register_variant(
        f"{name}_variant", cls, suspend_bytes=3 * MiB, persist_bytes=MiB // 4, barrier_timeout=5.0
    )
    made = s.creations(variant)
    plain = dist.new_group([0, 1], backend=variant)  # the variant's defaults
    os.environ["SUSPENDABLE_BYTES"] = str(2 * MiB)
    try:
        by_env = dist.new_group([0, 1], backend=variant)  # the environment wins over them
        s.configure(suspend_bytes=MiB)
        try:
            by_configure = dist.new_group([0, 1], backend=variant)  # configure() wins over both
        finally:
            s.configure()
    finally:
        del os.environ["SUSPENDABLE_BYTES"]
    made_again = dist.new_group([0, 1], backend=name)  # the variant left its model unchanged
    cpu = torch.device("cpu")
    ours = [g._get_backend(cpu) for g in (plain, by_env, by_configure)]
    free = s.device_memory()[0]
    ours[0].suspend()
    freed = s.device_memory()[0] - free
    ours[0].resume()
    return {
        "variant": variant,
        "torch names it": dist.get_backend(plain),
        "created": s.creations(variant) - made,
        "the ledger's": [a is b for a, b in zip(ours, s.backends(variant), strict=True)],
        "types": {type(b).__name__ for b in ours},
        "labels": {b.label.partition("#")[0] for b in ours},
        "suspend bytes": [b.memory_stats()["suspend"] for b in ours],
        "persist bytes": {b.memory_stats()["persist"] for b in ours},
        "barrier timeouts": {b.settings.barrier_timeout for b in ours},
        "freed": freed,
        "sum": _sum(plain, ctx.rank + 1.0),
        "model's own": made_again._get_backend(cpu).memory_stats()["suspend"],
    }


@pytest.mark.parametrize("name", VARIANTS)
def test_a_variant_of_its_own_starts_from_its_defaults_below_the_switches(name: str) -> None:
    """The demo's ``cpu_suspend`` is the model under a name of its own with bigger buffers:
    ``register_variant`` gives it defaults that the environment and ``configure()`` still beat."""
    for out in run_ranks(partial(_variant, name=name), 2, timeout=DEADLINE):
        assert out["torch names it"] == out["variant"] == f"{name}_variant"
        assert out["created"] == 3
        assert out["the ledger's"] == [True] * 3
        made_of = "SuspendableGloo" if name == suspendable.NAME_A else "SuspendablePy"
        assert out["types"] == {made_of}
        assert out["labels"] == {out["variant"]}
        assert out["suspend bytes"] == [3 * MiB, 2 * MiB, MiB]
        assert out["persist bytes"] == {MiB // 4}
        assert out["barrier timeouts"] == {5.0}
        assert out["freed"] == 3 * MiB  # the pretend device got the variant's buffer back
        assert out["sum"] == 3.0
        assert out["model's own"] == MiB  # the model's default, untouched by the variant


# ---- the barrier ----------------------------------------------------------------------------


def _barrier(ctx: Rank, name: str) -> dict[str, float]:
    _, dist, _ = _start(ctx)
    group, backend = _group(name)
    out = {}
    for call in ("suspend", "resume"):
        dist.barrier()  # the ranks start together (on WORLD, not the group)
        if ctx.rank == 1:
            time.sleep(0.5)
        out[call] = _timed(getattr(backend, call))
    out["sum"] = _sum(group, 1.0)
    return out


@pytest.mark.parametrize("name", VARIANTS)
def test_suspend_and_resume_wait_for_every_member(name: str) -> None:
    early, late = run_ranks(partial(_barrier, name=name), 2, timeout=DEADLINE)
    for call in ("suspend", "resume"):
        assert early[call] >= 0.4, f"{call} did not wait for the late rank: {early[call]:.3f} s"
        assert late[call] < early[call]
    assert early["sum"] == late["sum"] == 2.0


def _invalid_usage(ctx: Rank, name: str) -> dict[str, Any]:
    _, dist, _ = _start(ctx)
    group, backend = _group(name, barrier_timeout=3.0)
    out: dict[str, Any] = {}
    if ctx.rank == 0:  # alone: a barrier would wait 3 s for rank 1 and then fail otherwise
        out["resume while awake"] = _raises(backend.resume)
    dist.barrier()
    backend.suspend()
    if ctx.rank == 0:
        out["second suspend"] = _raises(backend.suspend)
    dist.barrier()
    backend.resume()
    out["sum"] = _sum(group, 1.0)  # no stray barrier was left to pair with anything
    out["stats"] = backend.memory_stats()
    return out


@pytest.mark.parametrize("name", VARIANTS)
def test_invalid_usage_raises_before_the_barrier(name: str) -> None:
    zero, one = run_ranks(partial(_invalid_usage, name=name), 2, timeout=DEADLINE)
    for call, detail in (
        ("resume while awake", "Not in suspended state"),
        ("second suspend", "Already suspended"),
    ):
        kind, message, seconds = zero[call]
        assert kind == "DistBackendError", (call, kind, message)
        assert "invalid usage" in message
        assert "ncclInvalidUsage" in message
        assert message.endswith(detail)
        assert seconds < 1.0, f"{call} waited {seconds:.2f} s: it reached a barrier"
    assert zero["sum"] == one["sum"] == 2.0
    assert zero["stats"]["suspended"] == one["stats"]["suspended"] == 0


# ---- switches -------------------------------------------------------------------------------


def _uninitialized(ctx: Rank, name: str) -> dict[str, Any]:
    _, _, s = _start(ctx)
    out: dict[str, Any] = {}
    for flavor in ("classic", "nccl2"):
        group, backend = _group(name, uninitialized=True, flavor=flavor)
        out[flavor] = [
            _raises(getattr(backend, c))[:2] for c in ("memory_stats", "suspend", "resume")
        ]
        if name == s.NAME_B:
            _sum(group, 1.0)  # classic NCCL's lazy init: the first collective makes the comm
        else:
            backend.initialize()  # collectives never reach Python in variant A
        backend.suspend()
        out[f"{flavor} then"] = backend.memory_stats()["suspended"]
        backend.resume()
    return out


@pytest.mark.parametrize("name", VARIANTS)
def test_uninitialized_communicator(name: str) -> None:
    for out in run_ranks(partial(_uninitialized, name=name), 2, timeout=DEADLINE):
        classic = ("RuntimeError", "NCCL communicator not initialized.")
        assert out["classic"] == [classic] * 3
        assert out["nccl2"] == [("RuntimeError", "ProcessGroupNCCL not initialized")] * 3
        assert out["classic then"] == out["nccl2 then"] == 1


def _unsupported(ctx: Rank, name: str) -> dict[str, Any]:
    _, dist, _ = _start(ctx)
    out: dict[str, Any] = {}
    for kind in ("backend", "old_nccl", "split_share"):
        # Only rank 0 cannot suspend; rank 1 must not reach a barrier alone, so it only asks.
        group, backend = _group(name, unsupported=kind if ctx.rank == 0 else None)
        stats = _raises(backend.memory_stats)
        if ctx.rank == 0:
            out[kind] = [stats[:2]] + [_raises(getattr(backend, c)) for c in ("suspend", "resume")]
        else:
            out[kind] = [stats[:2]]
        dist.barrier()
        out[f"{kind} sum"] = _sum(group, 1.0)
    return out


@pytest.mark.parametrize("name", VARIANTS)
def test_unsupported_on_one_rank(name: str) -> None:
    zero, one = run_ranks(partial(_unsupported, name=name), 2, timeout=DEADLINE)
    assert zero["backend"][0] == ("RuntimeError", f"Backend {name} does not support getMemoryStats")
    assert zero["backend"][1][:2] == ("RuntimeError", f"Backend {name} does not support suspend")
    assert zero["backend"][2][:2] == ("RuntimeError", f"Backend {name} does not support resume")
    assert zero["old_nccl"][0] == ("RuntimeError", "getMemoryStats() requires NCCL 2.29.7 or later")
    assert zero["old_nccl"][1][:2] == ("RuntimeError", "suspend() requires NCCL 2.29.7 or later")
    assert zero["split_share"][0] == ("", "")  # the stats still answer
    for kind, message, _ in zero["split_share"][1:]:
        assert kind == "DistBackendError"
        assert "ncclInvalidUsage" in message
        assert "split_share" in message
    for kind in ("backend", "old_nccl", "split_share"):
        assert all(seconds < 1.0 for *_, seconds in zero[kind][1:]), kind  # before any barrier
        assert one[kind] == [("", "")]
        assert zero[f"{kind} sum"] == one[f"{kind} sum"] == 2.0


def _never_arrives(ctx: Rank, name: str) -> dict[str, Any]:
    _, dist, s = _start(ctx)
    out: dict[str, Any] = {}
    # Suspend: rank 1 is held until it "arrives" 1 s late; rank 0 waits in the barrier for it.
    group, backend = _group(name, hang="suspend" if ctx.rank == 1 else None)
    dist.barrier()
    if ctx.rank == 1:
        threading.Timer(1.0, backend.arrive).start()
    out["suspend"] = _timed(backend.suspend)
    out["held"] = [c.outcome for c in s.calls("suspend", backend=backend)]
    backend.resume()
    out["sum"] = _sum(group, 1.0)
    # Resume: rank 1 never arrives and is aborted; rank 0 waits with no timeout until aborted.
    group, backend = _group(name, hang="resume" if ctx.rank == 1 else None)
    backend.suspend()
    result: dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: result.update(error=_raises(backend.resume)))
    waiter.start()
    waiter.join(1.5)
    out["still waiting after 1.5 s"] = waiter.is_alive()
    backend.abort()
    waiter.join(10)
    out["resume"] = result.get("error", ("still waiting", "", 0.0))[:2]
    return out


@pytest.mark.parametrize("name", VARIANTS)
def test_a_member_that_never_arrives_blocks_the_others(name: str) -> None:
    zero, one = run_ranks(partial(_never_arrives, name=name), 2, timeout=DEADLINE)
    assert zero["suspend"] >= 0.9
    assert one["suspend"] >= 0.9
    assert one["held"] == ["held (never arrives)", "ok"]
    assert zero["held"] == ["ok"]
    assert zero["sum"] == one["sum"] == 2.0
    assert zero["still waiting after 1.5 s"]
    assert one["still waiting after 1.5 s"]
    for out in (zero, one):
        kind, message = out["resume"]
        assert kind == "DistBackendError", out["resume"]
        assert "aborted" in message, out["resume"]


def _fails_after_barrier(ctx: Rank, name: str) -> dict[str, Any]:
    _, dist, s = _start(ctx)
    out: dict[str, Any] = {}
    group, backend = _group(name, fail_after_barrier="suspend" if ctx.rank == 0 else None)
    free = s.device_memory()[0]
    out["suspend"] = _raises(backend.suspend)[:2]
    out["freed"] = s.device_memory()[0] - free
    out["stats"] = backend.memory_stats()
    out["intact"] = backend.buffer_intact()
    if ctx.rank == 0:
        out["resume"] = _raises(backend.resume)[:2]
        out["suspend again"] = _raises(backend.suspend)[:2]
    dist.barrier()
    # Resume failing after its barrier on every rank leaves both suspended: a retry succeeds.
    group, backend = _group(name, fail_after_barrier="resume")
    backend.suspend()
    out["resume fails"] = _raises(backend.resume)[:2]
    out["still suspended"] = backend.memory_stats()["suspended"]
    backend.settings.fail_after_barrier = None
    backend.resume()
    out["retry"] = (backend.memory_stats()["suspended"], backend.buffer_intact(), _sum(group, 1.0))
    return out


@pytest.mark.parametrize("name", VARIANTS)
def test_failure_after_the_barrier(name: str) -> None:
    zero, one = run_ranks(partial(_fails_after_barrier, name=name), 2, timeout=DEADLINE)
    assert zero["suspend"][0] == "DistBackendError"
    assert one["suspend"] == ("", "")
    assert zero["freed"] == one["freed"] == MiB  # rank 1 passed the barrier too
    assert zero["stats"]["suspended"] == 0
    assert one["stats"]["suspended"] == 1
    assert not zero["intact"]
    assert not one["intact"]
    assert zero["resume"][0] == "DistBackendError"
    assert zero["resume"][1].endswith("Not in suspended state")
    assert zero["suspend again"][0] == "DistBackendError"
    for out in (zero, one):
        assert out["resume fails"][0] == "DistBackendError"
        assert out["still suspended"] == 1
        assert out["retry"] == (0, True, 2.0)


def _short_of_memory(ctx: Rank, name: str) -> dict[str, Any]:
    _, dist, s = _start(ctx)
    out: dict[str, Any] = {}
    group, backend = _group(name, barrier_timeout=3.0)
    backend.suspend()
    if ctx.rank == 0:
        _free, total = s.device_memory()
        s.occupy(total - MiB // 2 - s.resident_bytes())  # half a MiB left; resume needs one
        out["free"] = s.device_memory()[0]
        out["probe"] = s.memory_probe(None).free
        out["resume"] = _raises(backend.resume)
        out["suspended"] = backend.memory_stats()["suspended"]
        s.occupy(None)
    dist.barrier()
    backend.resume()
    out["sum"] = _sum(group, 1.0)
    backend.suspend()
    backend.settings.oom_on_resume = ctx.rank == 1  # forced, with room to spare
    if ctx.rank == 1:
        out["forced"] = _raises(backend.resume)[:2]
        backend.settings.oom_on_resume = False
    dist.barrier()
    backend.resume()
    out["intact"] = backend.buffer_intact()
    return out


@pytest.mark.parametrize("name", VARIANTS)
def test_short_of_memory(name: str) -> None:
    zero, one = run_ranks(partial(_short_of_memory, name=name), 2, timeout=DEADLINE)
    assert zero["free"] == zero["probe"] == MiB // 2
    kind, message, seconds = zero["resume"]
    assert kind == "DistBackendError"
    assert "out of memory" in message
    assert seconds < 1.0  # before the barrier: rank 1 never came
    assert zero["suspended"] == 1
    assert zero["sum"] == one["sum"] == 2.0
    assert one["forced"][0] == "DistBackendError"
    assert "out of memory" in one["forced"][1]
    assert zero["intact"]
    assert one["intact"]


# ---- WORLD, the debug wrapper, the 2.13 referencing fact ------------------------------------


def _world(ctx: Rank, name: str) -> dict[str, Any]:
    import gc

    torch, dist, s = _start(ctx, world=name)
    gc.collect()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    out = {"type": type(backend).__name__, "made": s.creations(name)}
    backend.suspend()
    out["suspended"] = backend.memory_stats()["suspended"]
    backend.resume()
    out["sum"] = _sum(None, 1.0)
    out["made after"] = s.creations(name)
    return out


@pytest.mark.parametrize("name", VARIANTS)
def test_world_itself_can_be_suspendable(name: str) -> None:
    for out in run_ranks(partial(_world, name=name), 2, timeout=DEADLINE):
        assert out["type"] in ("SuspendableGloo", "SuspendablePy")
        assert out == {**out, "made": 1, "suspended": 1, "sum": 2.0, "made after": 1}


def _debug_wrapper(ctx: Rank) -> dict[str, Any]:
    _, _, s = _start(ctx)
    out = {}
    for name in s.register():
        group, backend = _group(name)
        out[name] = (type(backend).__name__, _raises(backend.memory_stats)[:2], _sum(group, 1.0))
    return out


def test_the_debug_wrapper_hides_variant_a_but_not_b() -> None:
    env = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    for out in run_ranks(_debug_wrapper, 2, timeout=DEADLINE, env=env):
        # _ProcessGroupWrapper calls the C++ virtual: a Python override without a trampoline
        # (variant A) is never reached; variant B's trampoline is.
        kind, error, total = out[suspendable.NAME_A]
        assert (kind, error, total) == (
            "_ProcessGroupWrapper",
            ("RuntimeError", "Backend gloo does not support getMemoryStats"),
            2.0,
        )
        if B_AVAILABLE:
            kind, error, total = out[suspendable.NAME_B]
            assert (kind, error, total) == ("_ProcessGroupWrapper", ("", ""), 2.0)


def _unreferenced(ctx: Rank) -> dict[str, Any]:
    import gc

    torch, _dist, s = _start(ctx)
    group = _group(s.NAME_A)[0]  # no name may hold the backend
    kept = type(group._get_backend(torch.device("cpu"))).__name__
    s.BACKENDS.clear()  # drop the module's references
    gc.collect()
    backend = group._get_backend(torch.device("cpu"))
    return {
        "kept": kept,
        "dropped": type(backend).__name__,
        "stats": _raises(backend.memory_stats)[:2],
    }


def test_torch_2_13_forgets_an_unreferenced_python_backend_2_14_keeps_it() -> None:
    import torch

    lane_13 = torch.__version__.startswith("2.13")
    for out in run_ranks(_unreferenced, 2, timeout=DEADLINE):
        assert out["kept"] == "SuspendableGloo"
        if lane_13:
            assert out["dropped"] == "ProcessGroupGloo"
            assert out["stats"] == ("RuntimeError", "Backend gloo does not support getMemoryStats")
        else:  # 2.14 keeps the Python object alive with the C++ one
            assert out["dropped"] == "SuspendableGloo"
            assert out["stats"] == ("", "")


# ---- variant B: the call log and the refusal ------------------------------------------------


def _every_collective(torch: Any, dist: Any, group: Any, rank: int) -> None:
    peer = 1 - rank
    dist.all_reduce(torch.ones(2), group=group)
    dist.all_reduce(torch.ones(2), group=group, async_op=True).wait()
    dist.broadcast(torch.ones(2), src=0, group=group)
    dist.reduce(torch.ones(2), dst=0, group=group)
    dist.all_gather([torch.zeros(2), torch.zeros(2)], torch.ones(2), group=group)
    dist.all_gather_into_tensor(torch.zeros(4), torch.ones(2), group=group)
    dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(4), group=group)
    dist.all_to_all_single(torch.zeros(2), torch.ones(2), group=group)
    dist.all_to_all([torch.zeros(1), torch.zeros(1)], [torch.ones(1)] * 2, group=group)
    gather = [torch.zeros(1), torch.zeros(1)] if rank == 0 else None
    dist.gather(torch.ones(1), gather, dst=0, group=group)
    dist.scatter(torch.zeros(1), [torch.ones(1)] * 2 if rank == 0 else None, src=0, group=group)
    dist.barrier(group=group)
    with dist._coalescing_manager(group=group):
        dist.all_reduce(torch.ones(2), group=group)
        dist.all_reduce(torch.ones(3), group=group)
    send, recv = torch.ones(2), torch.zeros(2)
    ops = [dist.P2POp(dist.isend, send, peer, group), dist.P2POp(dist.irecv, recv, peer, group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    dist.broadcast_object_list([rank], src=0, group=group)
    dist.all_gather_object([None, None], rank, group=group)


def _call_log(ctx: Rank) -> dict[str, Any]:
    torch, dist, s = _start(ctx)
    group, backend = _group(s.NAME_B)
    _every_collective(torch, dist, group, ctx.rank)
    out: dict[str, Any] = {"awake": [c.op for c in s.calls(backend=backend) if c.outcome == "ok"]}
    backend.suspend()
    hooked = _has_pre_hooks()
    if hooked:  # the package's way on 2.14: a pre-hook refuses before the backend is reached

        class Asleep(RuntimeError):
            pass

        def refuse(args: Any) -> None:
            raise Asleep(str(args.name))

        group.register_pre_hook(1, refuse)
        out["hooked"] = _raises(lambda: _sum(group, 1.0))[:2]
        group.unregister_pre_hook(1)
    out["refused before"] = len(s.collectives(refused=True))
    out["collective"] = _raises(lambda: _sum(group, 1.0))[:2]
    out["sticky"] = _raises(lambda: _sum(group, 1.0))[:2]
    out["resume"] = _raises(backend.resume)[:2]
    out["stats when faulted"] = backend.memory_stats()["suspended"]
    out["refused"] = [(c.op, c.state) for c in s.collectives(refused=True)]
    return out


@needs_b
def test_variant_b_logs_every_collective_and_refuses_while_suspended() -> None:
    for out in run_ranks(_call_log, 2, timeout=DEADLINE):
        ops = set(out["awake"])
        expected = {
            "allreduce", "broadcast", "reduce", "allgather", "all_gather_single",
            "reduce_scatter_single", "all_to_all_single", "alltoall", "gather", "scatter",
            "barrier", "allreduce_coalesced", "send", "recv",
        }  # fmt: skip
        assert expected <= ops, expected - ops
        if "hooked" in out:
            assert out["hooked"] == ("Asleep", "HookOpName.ALLREDUCE")
        assert out["refused before"] == 0  # the hook kept it from the backend
        kind, message = out["collective"]
        assert kind == "DistBackendError"
        assert message.startswith(suspendable.ILLEGAL_ADDRESS)
        assert out["sticky"] == out["collective"]  # a fault is sticky, as a CUDA error is
        assert out["resume"] == out["collective"]
        assert out["stats when faulted"] == 0  # host-side stats still answer
        assert out["refused"] == [("allreduce", "suspended"), ("allreduce", "faulted")]


# ---- mixed groups: a CPU leg and a pretend accelerator leg ----------------------------------


def _mixed(ctx: Rank, name: str) -> dict[str, Any]:
    torch, dist, s = _start(ctx)
    acc = s.ACCELERATOR
    group = dist.new_group([0, 1], backend=f"cpu:gloo,{acc}:{name}")
    leg = group._get_backend(torch.device(acc))
    seen: list[tuple[str, list[str]]] = []
    if _has_pre_hooks():
        group.register_pre_hook(
            1, lambda a: seen.append((str(a.name), [t.device.type for t in a.input_tensors]))
        )

    def on_accelerator() -> list[float]:
        t = s.accelerator_tensor(torch.full((2,), ctx.rank + 1.0))
        dist.all_reduce(t, group=group)
        return t.host.tolist()

    def gathered() -> list[float]:
        out = s.accelerator_tensor(torch.zeros(4))
        dist.all_gather_into_tensor(
            out, s.accelerator_tensor(torch.full((2,), float(ctx.rank))), group=group
        )
        return out.host.tolist()

    result: dict[str, Any] = {
        "leg": type(leg).__name__,
        "device": str(s.accelerator_tensor(torch.ones(1)).device),
        "awake": on_accelerator(),
        "gathered": gathered(),
    }
    leg.suspend()
    result["cpu while asleep"] = _sum(group, 1.0)
    dist.barrier(group=group)  # a mixed group's barrier goes to the CPU leg
    result["accelerator while asleep"] = _raises(on_accelerator)[:2]
    result["log"] = [(c.op, c.state, c.outcome, c.devices) for c in s.calls(backend=leg)]
    result["hooks saw"] = sorted({(op, tuple(d)) for op, d in seen})
    return result


@pytest.mark.parametrize("name", VARIANTS)
def test_a_mixed_group_keeps_its_cpu_leg_while_the_accelerator_leg_sleeps(name: str) -> None:
    acc = suspendable.ACCELERATOR
    for out in run_ranks(partial(_mixed, name=name), 2, timeout=DEADLINE):
        assert out["leg"] in ("SuspendableGloo", "SuspendablePy")
        assert out["device"] == f"{acc}:0"
        assert out["awake"] == [3.0, 3.0]
        assert out["gathered"] == [0.0, 0.0, 1.0, 1.0]
        assert out["cpu while asleep"] == 2.0
        kind, message = out["accelerator while asleep"]
        assert kind == "DistBackendError"
        assert message.startswith(suspendable.ILLEGAL_ADDRESS)
        outcomes = [(state, outcome, devices) for _, state, outcome, devices in out["log"]]
        assert outcomes[-1] == ("suspended", "refused", (acc,))
        assert [o for o in outcomes if o[2]] == [
            ("awake", "ok", (acc,)), ("awake", "ok", (acc,)), ("suspended", "refused", (acc,))
        ]  # fmt: skip
        if _has_pre_hooks():
            cpu_ops = {("HookOpName.ALLREDUCE", ("cpu",)), ("HookOpName.BARRIER", ())}
            assert cpu_ops <= set(out["hooks saw"])
            on_leg = {("HookOpName.ALLREDUCE", (acc,)), ("HookOpName.ALLGATHER", (acc,))}
            if name == suspendable.NAME_B:  # through torch's own kernel: the hooks see it
                assert on_leg <= set(out["hooks saw"])
            else:  # variant A runs it on its own gloo: torch's hooks never see it
                assert not on_leg & set(out["hooks saw"])
