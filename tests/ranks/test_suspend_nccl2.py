"""torch 2.15 makes ``nccl`` mean nccl2 (issue 31): the holes it opens, closed on both lanes.

torch 2.15 cannot be installed here and NCCL needs a GPU, so each behaviour of 2.15 is a
stand-in of ``tests/support/nccl2.py`` (read its docstring): a backend whose groups are split
from WORLD's communicator at creation, a ``lazy_init`` backend whose ``memory_stats()`` would
block before its first collective, a nonblocking one whose suspend raises "in progress",
2.15's pre-hook order with a flight recorder's hook at torch's id, and 2.15's
``_world.pg_flight_recorder_hooks``. The oracles are outside the package: the stand-ins' call
log (what reached a backend, in which state), torch's ``_world`` maps, the exception each call
raises, torch's own results, a hook's record of what it saw, and a count of live handles.

Each run is shared by the tests that read it (``_ranks`` keeps its result for the session).
"""

from __future__ import annotations

from typing import Any

import pytest

from reloadpg_autopatch.tools import cpu_nccl as suspendable
from tests.support.ranks import GATE, Rank, run_ranks_once

pytestmark = pytest.mark.timeout(120)

#: A run's deadline: each run takes a few seconds; a hang is a failure.
DEADLINE = 60.0
HOOKS = suspendable.python_backend_available()  # torch 2.14: pre-hooks; 2.13: none
needs_hooks = pytest.mark.skipif(not HOOKS, reason="torch 2.13 has no ProcessGroup pre-hooks")


def _ranks(fn: Any, n: int = 2, **env: str) -> list[Any]:
    """``run_ranks(fn, n)`` with the gate on, once per session for the same arguments."""
    full = {**GATE, "SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT": "15", **env}
    return run_ranks_once(fn, n, timeout=DEADLINE, env=full)


def _start(ctx: Rank, mode: str, world: str = "gloo", register: bool = False) -> tuple:
    """Join WORLD on ``world`` in ``mode``; return (torch.distributed, the package, the
    suspendable stand-in, the nccl2 stand-ins)."""
    import warnings

    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.tools import cpu_nccl as s
    from tests.support import nccl2 as n2

    warnings.simplefilter("ignore", FutureWarning)
    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    s.register()
    n2.register()
    rpg.set_reload_mode(mode)
    rpg.set_memory_probe(s.memory_probe, device_types=("cpu", s.ACCELERATOR))
    rpg.set_memory_guard(0.0)
    ctx.init(backend=world, timeout=30.0)
    if register:
        rpg.register_default_process_group()
    return dist, rpg, s, n2


def _outcome(call: Any) -> tuple[str, Any]:
    """``("ok", result)`` or ``(exception class name, message)``."""
    try:
        return ("ok", call())
    except Exception as error:
        return (type(error).__name__, str(error))


def _sum(dist: Any, rank: int, group: Any = None) -> float:
    import torch

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=group)
    return t.item()


def _log(s: Any, since: int, *, stats: bool = False) -> list[tuple[str, str, str, str]]:
    return [
        (c.backend.split("#")[0], c.op, c.state, c.outcome)
        for c in s.CALLS[since:]
        if stats or c.op != "memory_stats"
    ]


def _refused_for_sleeping(kind: str, text: str, parent: str) -> bool:
    return (
        kind == "GroupSuspendedError"
        and parent in text
        and "reload_process_groups()" in text
        and "suspended" in text
    )


# ---- 1. a group split from a sleeping communicator is refused before the backend -------------


def _splits(ctx: Rank) -> dict[str, Any]:
    from torch.distributed import distributed_c10d as c10d
    from torch.distributed.device_mesh import init_device_mesh

    # WORLD's CPU leg is gloo (awake while asleep), its accelerator leg splits new groups.
    world_backend = f"cpu:gloo,{suspendable.ACCELERATOR}:nccl2_split"
    dist, rpg, s, n2 = _start(ctx, "suspend", world=world_backend, register=True)
    world = n2.world_backend()
    out: dict[str, Any] = {}
    since = len(s.CALLS)
    tp = dist.new_group([0, 1], group_desc="tp")
    out["split_awake"] = [c for c in _log(s, since) if c[1] == "split"]
    rpg.destroy_process_groups()
    out["world_state"] = world.state
    since, count = len(s.CALLS), len(c10d._world.pg_map)
    out["new_group"] = _outcome(lambda: dist.new_group([0, 1], group_desc="asleep"))
    made = len(c10d._world.pg_map) - count
    out["gloo"] = _outcome(lambda: _sum(dist, ctx.rank, dist.new_group([0, 1], backend="gloo")))
    out["gloo_made"] = len(c10d._world.pg_map) - count - made
    # Another backend that holds accelerator memory: 2.15 picks the split source by device.
    out["other_accelerator"] = _outcome(lambda: dist.new_group(backend=n2.nonblocking_backend()))
    out["split_group"] = _outcome(lambda: dist.group.WORLD.split_group([0, 1]))
    out["split_of_tp"] = _outcome(lambda: tp.split_group([0, 1]))
    if ctx.rank == 0:  # an excluded rank must not call shrink_group
        out["shrink_group"] = _outcome(lambda: dist.shrink_group([1]))
    out["device_mesh"] = _outcome(
        lambda: init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))
    )
    # A layer on top of ours that wraps groups itself (slime's patch): we step back for it,
    # and the refusal still comes first.
    ours = dist.new_group

    def outer(*args: Any, **kwargs: Any) -> Any:
        return ours(*args, **kwargs)

    outer.__reloadpg_outer_wraps__ = True  # type: ignore[attr-defined]
    dist.new_group = outer
    try:
        out["outer_layer"] = _outcome(lambda: dist.new_group([0, 1]))
    finally:
        dist.new_group = ours
    out["made_asleep"] = len(c10d._world.pg_map) - count - out["gloo_made"]
    out["reached_asleep"] = _log(s, since)
    out["world_state_asleep"] = world.state
    rpg.reload_process_groups()
    since = len(s.CALLS)
    out["after"] = _outcome(lambda: _sum(dist, ctx.rank, dist.new_group([0, 1])))
    out["split_after"] = [c for c in _log(s, since) if c[1] == "split"]
    out["world_after"] = _outcome(lambda: _sum(dist, ctx.rank))
    return out


def test_new_group_split_from_a_sleeping_world_is_refused_before_the_backend() -> None:
    """WORLD (registered, on a backend that splits each new group from WORLD's communicator
    at creation, as 2.15's nccl2 does) sleeps: ``new_group()``, and ``new_group`` on another
    backend that holds accelerator memory, raise ``GroupSuspendedError`` naming WORLD and
    ``reload_process_groups()``, on every rank, before torch reaches the
    backend (WORLD's log has no split while asleep, torch's maps gained no group, WORLD stays
    suspended, not faulted), also through a layer on top of ours that wraps groups itself
    (slime's patch, which we step back for). Awake, the same creation splits WORLD's
    communicator (the stand-in does what it models), and after the reload a new group works."""
    for rank, out in enumerate(_ranks(_splits)):
        assert out["split_awake"] == [("nccl2_split", "split", "awake", "ok")], out
        assert out["world_state"] == "suspended", out
        kind, text = out["new_group"]
        assert _refused_for_sleeping(kind, text, "WORLD"), (rank, kind, text)
        assert "new_group()" in text, text
        kind, text = out["other_accelerator"]
        assert _refused_for_sleeping(kind, text, "WORLD"), (rank, kind, text)
        assert out["made_asleep"] == 0, out
        kind, text = out["outer_layer"]  # slime's patch on top: it wraps, we step back
        assert _refused_for_sleeping(kind, text, "WORLD"), (rank, kind, text)
        assert [c for c in out["reached_asleep"] if c[1] in ("split", "shrink")] == [], out
        assert out["world_state_asleep"] == "suspended", out
        assert out["after"] == ("ok", 3.0), out["after"]
        assert out["split_after"] == [("nccl2_split", "split", "awake", "ok")], out
        assert out["world_after"] == ("ok", 3.0), out


def test_a_cpu_group_may_be_created_while_world_sleeps() -> None:
    """A gloo group needs no accelerator communicator: it is made while WORLD sleeps, works
    at once, and nothing reaches WORLD's backend."""
    for out in _ranks(_splits):
        assert out["gloo"] == ("ok", 3.0), out["gloo"]
        assert out["gloo_made"] == 1, out


def test_split_group_of_a_sleeping_group_is_refused_naming_it() -> None:
    """``ProcessGroup.split_group`` (what torch's ``split_group()`` and DeviceMesh call on the
    parent) raises ``GroupSuspendedError`` naming the parent (WORLD, or group 'tp') and
    ``reload_process_groups()``."""
    for rank, out in enumerate(_ranks(_splits)):
        kind, text = out["split_group"]
        assert _refused_for_sleeping(kind, text, "WORLD"), (rank, kind, text)
        kind, text = out["split_of_tp"]
        assert _refused_for_sleeping(kind, text, "'tp'"), (rank, kind, text)


def test_shrink_group_and_device_mesh_of_a_sleeping_world_are_refused() -> None:
    """``shrink_group`` (``ncclCommShrink`` over the parent) and a DeviceMesh (its groups
    made through ``new_group``, which it bound by name) raise ``GroupSuspendedError`` naming
    WORLD; no shrink reaches WORLD's backend."""
    for rank, out in enumerate(_ranks(_splits)):
        if rank == 0:
            kind, text = out["shrink_group"]
            assert _refused_for_sleeping(kind, text, "WORLD"), (kind, text)
        kind, text = out["device_mesh"]
        assert _refused_for_sleeping(kind, text, "WORLD"), (rank, kind, text)


# ---- 3. the guard fires before torch's flight recorder -------------------------------------


def _hook_order(ctx: Rank) -> dict[str, Any]:
    dist, rpg, _s, n2 = _start(ctx, "suspend", world=suspendable.NAME_A, register=True)
    from reloadpg_autopatch.groups.ways.suspend import HOOK_ID

    out: dict[str, Any] = {"hook_id": HOOK_ID}
    tp = dist.new_group([0, 1], backend=suspendable.NAME_A, group_desc="tp")
    # Torch's own dispatch (2.14.1: unspecified order): a recorder registered with torch at
    # the recorder's id, before the guard, keeps working across a cycle.
    real = n2.FlightRecorder()
    tp.register_pre_hook(n2.RECORDER_ID, real.pre)
    tp.register_post_hook(n2.RECORDER_ID, real.post)
    rpg.destroy_process_groups()
    out["real_asleep"] = _outcome(lambda: _sum(dist, ctx.rank, tp))
    out["real_in_flight_asleep"] = real.in_flight()  # unspecified on 2.14.1: reported only
    rpg.reload_process_groups()
    out["real_after"] = _outcome(lambda: _sum(dist, ctx.rank, tp))
    out["real_retired_after"] = list(real.retired)
    # torch 2.15's dispatch (ascending id), modelled: the guard must fire first.
    model = n2.OrderedPreHooks().install()
    try:
        recorder = n2.FlightRecorder()
        dist.group.WORLD.register_pre_hook(n2.RECORDER_ID, recorder.pre)
        dist.group.WORLD.register_post_hook(n2.RECORDER_ID, recorder.post)
        out["recorded_awake"] = (_outcome(lambda: _sum(dist, ctx.rank)), list(recorder.retired))
        rpg.destroy_process_groups()
        out["ids_asleep"] = model.ids(dist.group.WORLD)
        out["model_asleep"] = _outcome(lambda: _sum(dist, ctx.rank))
        out["model_in_flight"] = recorder.in_flight()
        rpg.reload_process_groups()
        out["model_after"] = _outcome(lambda: _sum(dist, ctx.rank))
        out["model_in_flight_after"] = recorder.in_flight()
    finally:
        model.uninstall()
    return out


@needs_hooks
def test_the_guard_fires_before_the_flight_recorder_and_never_replaces_it() -> None:
    """Under 2.15's id-ordered dispatch (modelled on 2.14.1, where the order is unspecified),
    a hook at torch's flight-recorder id (0x46524543) and the guard on a sleeping WORLD: the
    refused collective never reaches the recorder (no entry issued and never retired, which a
    hang dump would report), because the guard's id is below every id torch uses. On torch's
    own dispatch, a recorder registered at that id keeps recording across a cycle: the
    guard's registration neither replaced nor removed it."""
    for rank, out in enumerate(_ranks(_hook_order)):
        assert out["hook_id"] < 0, out["hook_id"]
        assert out["recorded_awake"] == (("ok", 3.0), ["ALLREDUCE"]), out
        assert out["ids_asleep"][0] == out["hook_id"], out["ids_asleep"]
        assert out["model_asleep"][0] == "GroupSuspendedError", out["model_asleep"]
        assert out["model_in_flight"] == [], (rank, out["model_in_flight"])
        assert out["model_after"] == ("ok", 3.0), out
        assert out["model_in_flight_after"] == [], out
        assert out["real_asleep"][0] == "GroupSuspendedError", out["real_asleep"]
        assert out["real_after"] == ("ok", 3.0), out
        assert out["real_retired_after"][-1:] == ["ALLREDUCE"], out


# ---- 4 and 5. lazy_init and nonblocking communicators in suspend mode ----------------------


def _answers_suspend(ctx: Rank) -> dict[str, Any]:
    dist, rpg, s, n2 = _start(ctx, "suspend")
    out: dict[str, Any] = {}
    since = len(s.CALLS)
    made = _outcome(lambda: dist.new_group([0, 1], backend=n2.LAZY, group_desc="lazy"))
    out["lazy_made"] = made[0] if made[0] != "ok" else "ok"
    out["lazy_log_made"] = _log(s, since, stats=True)
    if made[0] == "ok":
        lazy = made[1]
        backend = s.backends(n2.LAZY)[-1]
        out["destroy_1"] = _outcome(rpg.destroy_process_groups)
        out["report_1"] = rpg.last_cycle_report().to_dict()["destroy"]
        out["lazy_name"] = str(lazy.group_name)
        out["lazy_asleep_1"] = _outcome(lambda: _sum(dist, ctx.rank, lazy))[0]
        out["reload_1"] = _outcome(rpg.reload_process_groups)
        out["lazy_log_1"] = _log(s, since, stats=True)
        out["lazy_after_1"] = _outcome(lambda: _sum(dist, ctx.rank, lazy))
        backend.initialize()  # its first collective created the communicator (see nccl2.py)
        since = len(s.CALLS)
        out["destroy_2"] = _outcome(rpg.destroy_process_groups)
        out["lazy_state_2"] = backend.state
        out["reload_2"] = _outcome(rpg.reload_process_groups)
        out["lazy_log_2"] = [c[1:] for c in _log(s, since) if c[0] == n2.LAZY]
        out["lazy_after_2"] = _outcome(lambda: _sum(dist, ctx.rank, lazy))
    since = len(s.CALLS)
    nonblocking = n2.nonblocking_backend()
    made = _outcome(lambda: dist.new_group([0, 1], backend=nonblocking, group_desc="nb"))
    out["nonblocking_made"] = (made[0], made[1] if made[0] != "ok" else None)
    if made[0] == "ok":  # today's code takes it; its destroy then suspends it
        out["nonblocking_destroy"] = _outcome(rpg.destroy_process_groups)
        out["nonblocking_reload"] = _outcome(rpg.reload_process_groups)
    out["nonblocking_log"] = [c for c in _log(s, since) if c[0] == n2.NONBLOCKING]
    return out


def test_a_lazy_group_is_not_probed_before_its_first_collective() -> None:
    """A ``lazy_init`` group that never communicated: its ``memory_stats()`` is never called
    (it would create the communicator, a collective a lone rank would block in), suspend mode
    takes it, and the destroy guards it without suspending it, as a classic group not yet
    initialized ("not initialized"); once its communicator exists, the next destroy asks it
    and suspends it."""
    for rank, out in enumerate(_ranks(_answers_suspend)):
        assert out["lazy_made"] == "ok", (rank, out["lazy_made"])
        assert [c for c in out["lazy_log_1"] if c[3] == "would block"] == [], out["lazy_log_1"]
        assert [c for c in out["lazy_log_1"] if c[1] == "memory_stats"] == [], out["lazy_log_1"]
        assert out["destroy_1"][0] == "ok", out["destroy_1"]
        assert out["report_1"]["groups"].get("guarded") == [out["lazy_name"]], out["report_1"]
        assert out["lazy_asleep_1"] == "GroupSuspendedError"
        assert out["reload_1"][0] == "ok", out
        assert out["lazy_after_1"] == ("ok", 3.0), out
        assert out["destroy_2"][0] == "ok", out
        assert out["lazy_state_2"] == "suspended", out
        ops = [op for op, _state, outcome in out["lazy_log_2"] if outcome == "ok"]
        assert (ops.count("suspend"), ops.count("resume")) == (1, 1), out["lazy_log_2"]
        assert out["lazy_after_2"] == ("ok", 3.0), out


def test_a_nonblocking_communicator_is_a_named_refusal_in_suspend_mode() -> None:
    """A communicator made by nccl2's ``reconfigure()`` is nonblocking (its options say
    ``enable_reconfigure``; ``config.blocking`` stays unset) and its suspend would raise
    "in progress": suspend mode refuses it by name at its creation (``ModeRefusedError``
    saying nonblocking), and its suspend is never called, so it is never broken."""
    for rank, out in enumerate(_ranks(_answers_suspend)):
        kind, text = out["nonblocking_made"]
        assert kind == "ModeRefusedError", (rank, kind, text)
        assert "nonblocking" in text, text
        assert [c for c in out["nonblocking_log"] if c[1] == "suspend"] == [], out


def _answers_auto(ctx: Rank) -> dict[str, Any]:
    dist, rpg, s, n2 = _start(ctx, "auto")
    from reloadpg_autopatch.tools.doctor import diagnose

    out: dict[str, Any] = {}
    since = len(s.CALLS)
    nb = dist.new_group([0, 1], backend=n2.nonblocking_backend(), group_desc="nb")
    lazy = dist.new_group([0, 1], backend=n2.LAZY, group_desc="lazy")
    if ctx.rank == 0:  # the doctor on one rank alone, as a user runs it in a live process
        report = diagnose()
        out["doctor_mode"] = report.fidelity.get("mode", {}).get("backends")
    out["first_barrier"] = _sum(dist, ctx.rank)
    out["destroy"] = _outcome(rpg.destroy_process_groups)
    out["nb_asleep"] = _outcome(lambda: _sum(dist, ctx.rank, nb))[0]
    out["reload"] = _outcome(rpg.reload_process_groups)
    out["nb_after"] = _outcome(lambda: _sum(dist, ctx.rank, nb))
    out["lazy_after"] = _outcome(lambda: _sum(dist, ctx.rank, lazy))
    out["log"] = _log(s, since, stats=True)
    return out


def test_a_nonblocking_communicator_falls_back_in_auto_and_is_never_broken() -> None:
    """In ``auto`` mode the nonblocking group takes another way (in place where torch can
    reconfigure, else behind a wrapper): its suspend is never called, the cycle succeeds and
    the group works after it (never ``GroupBrokenError``)."""
    for rank, out in enumerate(_ranks(_answers_auto)):
        nonblocking = [c for c in out["log"] if c[0] == "nccl2_nonblocking"]
        assert [c for c in nonblocking if c[1] == "suspend"] == [], nonblocking
        assert (out["destroy"][0], out["reload"][0]) == ("ok", "ok"), out
        assert out["nb_asleep"] != "GroupBrokenError", out
        assert out["nb_after"] == ("ok", 3.0), (rank, out["nb_after"])


def test_the_doctor_on_one_rank_never_probes_a_lazy_group() -> None:
    """Rank 0 runs the doctor alone (rank 1 waits in a collective): it explains the lazy
    group without calling its ``memory_stats()`` (no call would block), and the ranks go on."""
    for rank, out in enumerate(_ranks(_answers_auto)):
        assert [c for c in out["log"] if c[3] == "would block"] == [], (rank, out["log"])
        assert out["first_barrier"] == 3.0
        assert out["lazy_after"] == ("ok", 3.0), out
        if rank == 0:
            assert out["doctor_mode"], out


# ---- 6. _world.pg_flight_recorder_hooks kept consistent ------------------------------------


def _recorder_map(ctx: Rank) -> dict[str, Any]:
    from tests.support import nccl2

    fr = nccl2.FlightRecorderMap().install()  # before WORLD: WORLD gets a handle too
    dist, rpg, _s, n2 = _start(ctx, "wrapper", world=suspendable.NAME_A)
    rpg.register_default_process_group(accelerator_backends=(suspendable.NAME_A,))
    from torch.distributed import distributed_c10d as c10d

    def snapshot() -> dict[str, Any]:
        hooks = fr.hooks()
        world = dist.group.WORLD
        return {
            "visible": len(hooks),
            "distinct_values": len({id(v) for v in hooks.values()}),
            "raw": len(fr.raw_keys()),
            "alive": n2.RecorderHandle.alive(),
            "tp_carried": hooks.get(tp) is not None and hooks.get(tp) is hooks.get(tp.group),
            "world_carried": hooks.get(world.group) is not None
            and hooks.get(world) is hooks.get(world.group),
            "stale": sum(1 for k in hooks if not dict.__contains__(c10d._world.pg_map, k)),
        }

    tp = dist.new_group([0, 1], backend=suspendable.NAME_A, group_desc="tp")
    out = {"awake": snapshot()}
    rpg.destroy_process_groups()
    hooks = fr.hooks()
    out["asleep"] = {
        "visible": len(hooks),
        "raw": len(fr.raw_keys()),
        "alive": n2.RecorderHandle.alive(),
        "tp": hooks.get(tp),
    }
    rpg.reload_process_groups()
    out["after"] = snapshot()
    out["sum_after"] = _sum(dist, ctx.rank, tp)
    dist.destroy_process_group(tp)  # the program lets it go: WORLD stays
    hooks = fr.hooks()
    out["released"] = {
        "visible": len(hooks),
        "raw": len(fr.raw_keys()),  # WORLD's handle and its stand-in's alias
        "alive": n2.RecorderHandle.alive(),
    }
    return out


def test_the_flight_recorder_map_follows_aliases_and_the_world_swap() -> None:
    """With 2.15's ``_world.pg_flight_recorder_hooks`` (modelled): a reloadable group and
    WORLD's stand-in answer for their native group's recorder handle there, as in torch's other
    maps, without showing twice in its length or values; when the destroy removes the native
    groups (WORLD swapped for a CPU WORLD, 'tp' destroyed), no entry and no handle stays
    behind (a kept handle holds its group alive: a leak); after the reload each again
    answers for its new native group's handle; a group the program releases takes its alias
    and its handle with it, while WORLD keeps its own."""
    for rank, out in enumerate(_ranks(_recorder_map)):
        for phase in ("awake", "after"):
            got = out[phase]
            assert (got["tp_carried"], got["world_carried"]) == (True, True), (rank, phase, got)
            assert (got["visible"], got["distinct_values"]) == (2, 2), (rank, phase, got)
            assert (got["alive"], got["stale"]) == (2, 0), (rank, phase, got)
        asleep = out["asleep"]
        assert asleep == {"visible": 0, "raw": 0, "alive": 0, "tp": None}, (rank, asleep)
        assert out["sum_after"] == 3.0
        assert out["released"] == {"visible": 1, "raw": 2, "alive": 1}, (rank, out["released"])


# ---- 2. the doctor names the implementation and keys its warnings on it --------------------


def _doctor(ctx: Rank) -> dict[str, Any]:
    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.tools import cpu_nccl as s
    from reloadpg_autopatch.tools.doctor import diagnose, render
    from tests.support import nccl2 as n2

    s.register()
    n2.register()
    rpg.set_reload_mode("suspend")
    out = {}
    store = dist.TCPStore(ctx.host, ctx.port, ctx.world_size, is_master=False)
    for backend in (n2.CLASSIC, n2.NCCL2):
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(f"{backend}/", store),
            rank=ctx.rank,
            world_size=ctx.world_size,
        )
        report = diagnose()
        out[backend] = {
            "nccl": report.fidelity.get("nccl"),
            "warnings": report.fidelity.get("suspend", {}).get("warnings", []),
            "text": render(report),
        }
        dist.destroy_process_group()
    return out


def test_the_doctor_names_the_implementation_and_keys_its_warnings_on_it() -> None:
    """The doctor reads WORLD's backend (stand-ins named like torch's classes, registered under
    names that say nothing of NCCL): it names the implementation (classic ``ProcessGroupNCCL``
    or nccl2) and the variable that chooses what ``nccl`` means, warns of lazy p2p
    communicators without ``device_id`` for the classic one only, and tells nccl2's users that
    a group is not created while WORLD sleeps."""
    (out,) = _ranks(_doctor, 1)
    classic, new = out["standin_classic"], out["standin_nccl2"]
    assert classic["nccl"]["world"][0]["implementation"] == "classic", classic["nccl"]
    assert new["nccl"]["world"][0]["implementation"] == "nccl2", new["nccl"]
    for got in (classic, new):
        assert got["nccl"]["variable"] == "TORCH_DIST_USE_NCCL2", got["nccl"]
        assert "TORCH_DIST_USE_NCCL2" in got["text"], got["text"]
    assert any("device_id" in w for w in classic["warnings"]), classic["warnings"]
    assert not any("device_id" in w for w in new["warnings"]), new["warnings"]
    assert any("while WORLD sleeps" in w for w in new["warnings"]), new["warnings"]
    assert "ProcessGroupNCCL2" in new["text"], new["text"]
