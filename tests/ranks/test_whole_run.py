"""The whole run (issue 15): fork, WORLD's identity, threads as ranks, names and faults.

A real RL run forks data-loader workers every epoch, keeps ``dist.group.WORLD`` in objects,
compiles its step, runs its test suite with threads as ranks in the same image, and loses nodes.
Every rank here is activated by the gate alone, on real gloo. The oracles are torch's and the
OS's: a child's exit status, object identity as torch reports it, Dynamo's own frame counters,
torch's ``_world`` maps, the wall clock against WORLD's timeout, and the gate-off run as the
control.
"""

from __future__ import annotations

import functools
import os
from datetime import timedelta
from typing import Any

import pytest

from tests.support import run_events
from tests.support.ranks import GATE, Rank, run_ranks, total

pytestmark = pytest.mark.timeout(300)


def _fork_across_cycles(ctx: Rank, registered: bool) -> dict:
    import reloadpg_autopatch as rpg

    dist = run_events.begin(ctx, registered)
    group = dist.new_group([0, 1])
    assert group.group_name  # handed out: the package now holds the group for its name
    seen = [run_events.forks("before")]
    for cycle in range(2):
        rpg.destroy_process_groups()
        seen.append(run_events.forks(f"destroyed {cycle}"))
        rpg.reload_process_groups()
        seen.append(run_events.forks(f"reloaded {cycle}"))
    return {
        "forks": seen,
        "group": total(group, ctx.rank + 1),
        "world": total(None, 1),
    }


FORK_CASES = {
    "wrapper": ({"SLIME_RELOADABLE_PG_MODE": "wrapper"}, False),
    "wrapper+WORLD": ({"SLIME_RELOADABLE_PG_MODE": "wrapper"}, True),
    # Compiled batched p2p makes wrappers hold their first communicator (see the README).
    "wrapper+compiled-p2p": (
        {"SLIME_RELOADABLE_PG_MODE": "wrapper", "TORCHDYNAMO_ENABLE_P2P_COMPILATION": "1"},
        False,
    ),
    "auto+WORLD": ({"SLIME_RELOADABLE_PG_MODE": "auto"}, True),
    "native": ({"SLIME_RELOADABLE_PG_MODE": "native"}, False),
    "native+WORLD": ({"SLIME_RELOADABLE_PG_MODE": "native"}, True),
}


@pytest.mark.parametrize("case", list(FORK_CASES))
def test_fork_workers_work_before_between_and_after_cycles(case: str) -> None:
    """DataLoader workers and pool workers fork from a rank (Linux's default start method):
    none may crash, before the first destroy, between destroy and reload, or after reload."""
    env, registered = FORK_CASES[case]
    if env["SLIME_RELOADABLE_PG_MODE"] == "native" and not run_events.reconfigures():
        pytest.skip("native mode needs torch 2.14's ProcessGroup.reconfigure")
    reports = run_ranks(
        functools.partial(_fork_across_cycles, registered=registered),
        2,
        timeout=240,
        env={**GATE, **env},
    )
    for report in reports:
        for fork in report["forks"]:
            assert fork["loader"] == 28.0, fork
            assert fork["pool"] == [0, 1, 4, 9, 16, 25], fork
            assert fork["bare"] == 0, fork
        assert report["group"] == 3.0
        assert report["world"] == 2.0


def _fork_during(ctx: Rank, step: str) -> dict:
    """Fork while another thread is inside destroy or reload (waiting for the late peer)."""
    import json
    import select
    import signal
    import threading
    import time

    import reloadpg_autopatch as rpg

    dist = run_events.begin(ctx, registered=True)
    group = dist.new_group([0, 1])
    if step == "reload":
        rpg.destroy_process_groups()
    call = rpg.destroy_process_groups if step == "destroy" else rpg.reload_process_groups
    if ctx.rank == 1:
        time.sleep(4)  # rank 0's thread waits for this rank inside the step
        call()
        if step == "destroy":
            rpg.reload_process_groups()
        return {"rank": 1, "sum": total(group, 2)}
    worker = threading.Thread(target=call)
    worker.start()
    time.sleep(1.5)  # the worker is inside the step now, holding whatever it holds
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            started = time.monotonic()
            try:
                rpg.destroy_process_groups()
                rpg.reload_process_groups()
                outcome = "returned"
            except Exception as error:
                outcome = f"{type(error).__name__}: {error}"
            os.write(write_end, json.dumps([outcome, time.monotonic() - started]).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    ready, _, _ = select.select([read_end], [], [], 20)
    if ready:
        with os.fdopen(read_end) as pipe:
            child = json.loads(pipe.read() or '["died without a report", null]')
        _, status = os.waitpid(pid, 0)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_end)
        child, status = ["hang: no answer within 20 s", None], None
    worker.join(60)
    if step == "destroy":
        rpg.reload_process_groups()
    return {"rank": 0, "child": child, "status": status, "sum": total(group, 1)}


@pytest.mark.parametrize("step", ["destroy", "reload"])
def test_a_child_forked_inside_a_step_neither_crashes_nor_hangs(step: str) -> None:
    reports = run_ranks(functools.partial(_fork_during, step=step), 2, timeout=180, env=GATE)
    child = reports[0]
    assert child["status"] == 0, child
    assert child["child"][0] == "returned", child  # the child holds no groups: nothing to do
    assert child["child"][1] < 5, child
    assert [r["sum"] for r in reports] == [3.0, 3.0]


# ---- 2. one WORLD for the life of the world --------------------------------------------------


def _world_identity(ctx: Rank, mode: str) -> dict:
    import torch
    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch as rpg

    dist = run_events.begin(ctx, registered=True)
    saved = dist.group.WORLD
    pair = dist.new_group([0, 1])
    peer = 1 - ctx.rank
    outgoing, incoming = torch.tensor([10.0 + ctx.rank]), torch.zeros(1)
    ops = [
        dist.P2POp(dist.isend, outgoing, peer, pair),
        dist.P2POp(dist.irecv, incoming, peer, pair),
    ]
    created = []
    helper = c10d._new_process_group_helper

    def counting(*args: Any, **kwargs: Any) -> Any:  # every native group torch builds
        created.append(1)
        return helper(*args, **kwargs)

    c10d._new_process_group_helper = counting
    cycles = []
    for _ in range(3):
        before = len(created)
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        incoming.zero_()
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        # torch's own loops over its map see only the native groups it holds now.
        live = [any(pg is op.group for pg in c10d._world.pg_map) for op in ops]
        cycles.append(
            {
                "same": [
                    dist.group.WORLD is saved,
                    dist.GroupMember.WORLD is saved,
                    c10d._get_default_group() is saved,
                ],
                "rank": dist.get_rank(saved),
                "size": dist.get_world_size(saved),
                "sum": total(saved, ctx.rank + 1),
                "p2p": incoming.item(),
                "p2p_on_live_group": live,
                "created": len(created) - before,
            }
        )
        dist.barrier(group=saved)
    return {"cycles": cycles, "rank": ctx.rank, "in_place": type(pair) is dist.ProcessGroup}


@pytest.mark.parametrize("mode", ["wrapper", "auto", "native"])
def test_world_is_one_object_for_the_life_of_the_world(mode: str) -> None:
    if mode == "native" and not run_events.reconfigures():
        pytest.skip("native mode needs torch 2.14's ProcessGroup.reconfigure")
    reports = run_ranks(
        functools.partial(_world_identity, mode=mode),
        2,
        env={**GATE, "SLIME_RELOADABLE_PG_MODE": mode},
    )
    for report in reports:
        for cycle in report["cycles"]:
            assert cycle["same"] == [True, True, True], cycle
            assert cycle["rank"] == report["rank"]
            assert cycle["size"] == 2
            assert cycle["sum"] == 3.0
            assert cycle["p2p"] == 10.0 + (1 - report["rank"]), cycle
            assert cycle["p2p_on_live_group"] == [True, True], cycle
            # WORLD really went through the cycle: torch built its communicators again
            # (the temporary and the restored WORLD and the pair; in place: none).
            assert cycle["created"] == (0 if report["in_place"] else 3), cycle


CYCLES = 20


def _compiled_world(ctx: Rank) -> dict:
    import torch
    from torch._dynamo.utils import counters
    from torch.distributed import _functional_collectives as funcol

    import reloadpg_autopatch as rpg

    dist = run_events.begin(ctx, registered=True)

    def step(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        dist.all_reduce(y)  # no group: WORLD
        return funcol.all_reduce(y, "sum", dist.group.WORLD)

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    values = [compiled(torch.ones(1)).item()]
    frames_after_first = counters["frames"]["ok"]
    for _ in range(CYCLES):
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        values.append(compiled(torch.ones(1)).item())
    return {
        "values": values,
        "compiles_first": frames_after_first,
        "compiles_total": counters["frames"]["ok"],
        "recompiles": counters["recompiles"] and dict(counters["recompiles"]),
    }


def test_a_compiled_step_with_world_never_recompiles_across_cycles() -> None:
    """Dynamo guards on WORLD's identity: one object means one compilation for 20 cycles
    (at its default recompile limit of 8, a new WORLD per cycle fails under fullgraph)."""
    for report in run_ranks(_compiled_world, 2, timeout=280, env=GATE):
        assert report["values"] == [8.0] * (CYCLES + 1)
        assert report["compiles_total"] == report["compiles_first"], report


@pytest.mark.parametrize(
    ("gate", "policy"),
    [("off", None), ("on", None), ("on", "all")],
    ids=["gate-off", "auto", "all"],
)
def test_threads_as_ranks_behave_as_with_the_gate_off(gate: str, policy: str | None) -> None:
    env = GATE if gate == "on" else {"SLIME_RELOADABLE_PG": None}
    (report,) = run_ranks(
        functools.partial(run_events.threaded_world, policy=policy), 1, timeout=90, env=env
    )
    assert report["hung"] == [], report
    assert report["results"] == {0: [10.0, 3.0], 1: [10.0, 3.0], 2: [10.0], 3: [10.0]}, report


# ---- 6, 7. names -----------------------------------------------------------------------------


def _names_while_destroyed(ctx: Rank) -> dict:
    import torch
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch as rpg

    dist = run_events.begin(ctx, registered=True)
    pair = dist.new_group([0, 1])
    name = pair.group_name  # handed out, as DeviceMesh and functional collectives keep it
    made_while_destroyed = []
    lookups = []
    for _ in range(3):
        rpg.destroy_process_groups()
        made_while_destroyed.append(dist.new_group([0, 1], use_local_synchronization=True))
        for call in (
            lambda: funcol.all_reduce(torch.ones(1), "sum", name).wait(),
            lambda: c10d._resolve_process_group(name).size(),
        ):
            try:
                call()
                lookups.append("no error")
            except RuntimeError as error:
                lookups.append(str(error))
        rpg.reload_process_groups()
    sums = [total(g, ctx.rank + 1) for g in [pair, *made_while_destroyed]]
    names = [g.group_name for g in made_while_destroyed]
    return {"sums": sums, "lookups": lookups, "distinct": len(set(names)) == len(names)}


def test_names_stay_unique_and_say_reload_while_destroyed() -> None:
    for report in run_ranks(_names_while_destroyed, 2, timeout=180, env=GATE):
        assert report["sums"] == [3.0] * 4
        assert report["distinct"]
        for message in report["lookups"]:
            assert "reload_process_groups()" in message, message


# ---- 3. a rank that dies or never comes ------------------------------------------------------

#: WORLD's timeout in the kill tests: what a survivor waits out, so the shortest that still lets
#: the good cycle before the kill finish on a loaded machine.
WORLD_S = 3
KILL_STEPS = ("destroy", "temporary", "agreement", "world", "creation")


def _killed(ctx: Rank, victim: int, step: str) -> dict:
    import time

    import reloadpg_autopatch as rpg

    dist = run_events.begin(ctx, registered=True, timeout=timedelta(seconds=WORLD_S))
    # Every free waits for its members, as NCCL 2.31's destroy does (a CPU model).
    from tests.support import destroy_barrier

    destroy_barrier.install(dist.TCPStore(ctx.host, ctx.port, ctx.world_size, is_master=False))
    groups = [dist.new_group([0, 1, 2]), dist.new_group([0, 1]), dist.new_group([1, 2])]
    rpg.destroy_process_groups()
    rpg.reload_process_groups()  # one good cycle first
    dist.barrier()  # every rank is done with it
    doomed = ctx.rank == victim
    if doomed and step == "destroy":
        os._exit(0)
    if doomed and step == "temporary":
        run_events.die_at("world")  # dies creating the temporary WORLD of the destroy
    started = time.monotonic()
    try:
        if step in ("destroy", "temporary"):
            rpg.destroy_process_groups()
            # The temporary WORLD connects lazily: its loss may show at the next step.
            rpg.reload_process_groups()
        else:
            rpg.destroy_process_groups()
            if doomed and step == "agreement":
                os._exit(0)
            if doomed:
                run_events.die_at(step)
            started = time.monotonic()
            rpg.reload_process_groups()
        outcome = "no error"
    except RuntimeError as error:
        outcome = str(error)
    del groups
    return {"outcome": outcome, "seconds": time.monotonic() - started}


@pytest.mark.parametrize("step", KILL_STEPS)
@pytest.mark.parametrize("victim", [0, 1, 2], ids=["store-host", "rank1", "rank2"])
def test_a_rank_that_dies_in_a_step_fails_the_others_within_worlds_timeout(
    victim: int, step: str
) -> None:
    """Every survivor raises within WORLD's timeout plus a few seconds (never a group's own
    30-minute default), naming the step, the cycle and the missing rank (or the lost store).
    Every free waits for its members there, as NCCL 2.31's destroy does
    (``tests/support/destroy_barrier.py``)."""
    reports = run_ranks(
        functools.partial(_killed, victim=victim, step=step),
        3,
        timeout=120,
        env=GATE,
        store_in_rank0=True,
        may_die=frozenset({victim}),
    )
    phrases = {
        "destroy": ("destroy",),
        "temporary": ("temporary", "agreement"),
        "agreement": ("agreement",),
        "world": ("WORLD",),
        "creation": ("creating group",),
    }
    for rank, report in enumerate(reports):
        if rank == victim:
            continue
        message = report["outcome"]
        assert report["seconds"] < WORLD_S + 10, (rank, report)
        assert "cycle" in message, (rank, message)
        if victim == 0:
            # A survivor learns of the lost store at its next store call, which may belong to
            # the step before the one the host died in.
            assert "store is unreachable" in message, (rank, message)
        else:
            assert any(phrase in message for phrase in phrases[step]), (rank, message)
            assert f"ranks {victim}" in message, (rank, message)


# ---- 8. native mode is the same library ------------------------------------------------------


class _Holder:
    """A module-like object that keeps a group, as Megatron's configs do."""

    def __init__(self, group: Any) -> None:
        self.group = group


def _copied(group: Any) -> list[bool] | str:
    import copy

    try:
        return [
            copy.copy(group) is group,
            copy.deepcopy(group) is group,
            copy.deepcopy(_Holder(group)).group is group,
        ]
    except Exception as error:
        return f"{type(error).__name__}: {error}"


def _copies(ctx: Rank) -> dict:
    import copy

    import reloadpg_autopatch as rpg

    registered = os.environ.get("TEST_WORLD") != "unregistered"
    dist = run_events.begin(ctx, registered=registered)
    out = {}
    if registered:  # copied as a handle from its registration on, before any other group
        out["world"] = _copied(dist.group.WORLD)
    pair = dist.new_group([0, 1])
    out["pair"] = _copied(pair)
    if not registered:  # torch's own WORLD: as torch's class copies once a group keeps it
        out["world"] = _copied(dist.group.WORLD)
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    out["sum"] = total(copy.deepcopy(_Holder(pair)).group, 1)
    # Whether torch's own class was taught to copy as a handle: only once a group keeps
    # torch's object, never behind wrappers alone.
    out["taught"] = "__copy__" in vars(dist.ProcessGroup)
    return out


@pytest.mark.parametrize(
    ("mode", "world"),
    [
        ("wrapper", "registered"),
        ("native", "registered"),
        ("auto", "registered"),
        ("native", "unregistered"),
    ],
    ids=["wrapper", "native", "auto", "native-world-unregistered"],
)
def test_copying_a_group_gives_the_group_in_every_mode(mode: str, world: str) -> None:
    """Megatron deep-copies configs that hold groups: a copy is the group itself, whether a
    wrapper or torch's own object (in place, where torch can: native, and auto on gloo). torch's
    class is taught that where the program first holds torch's objects, at WORLD's registration
    or, WORLD unregistered (torch's own), at the first group's creation; behind wrappers alone
    it stays as torch made it."""
    if mode == "native" and not run_events.reconfigures():
        pytest.skip("native mode needs torch 2.14's ProcessGroup.reconfigure")
    env = {**GATE, "SLIME_RELOADABLE_PG_MODE": mode, "TEST_WORLD": world}
    for report in run_ranks(_copies, 2, env=env):
        assert report["pair"] == [True, True, True], report
        assert report["world"] == [True, True, True], report
        assert report["sum"] == 2.0
        assert report["taught"] is (mode != "wrapper" and run_events.reconfigures()), report


def _detail_refusal(ctx: Rank) -> dict:
    dist = run_events.begin(ctx, registered=False)
    try:
        dist.new_group([0, 1])
        return {"outcome": "no error"}
    except RuntimeError as error:
        return {"outcome": str(error)}


def test_native_mode_under_detail_debugging_says_why_it_cannot() -> None:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL wraps gloo in torch's _ProcessGroupWrapper, which cannot
    reconfigure: native mode must name the variable as the reason, not a backend riddle."""
    if not run_events.reconfigures():
        pytest.skip("native mode needs torch 2.14's ProcessGroup.reconfigure")
    env = {**GATE, "SLIME_RELOADABLE_PG_MODE": "native", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    for report in run_ranks(_detail_refusal, 2, env=env):
        assert "TORCH_DISTRIBUTED_DEBUG" in report["outcome"], report


# ---- 5. a thread in a collective while its group is destroyed --------------------------------


def _collective_during_destroy(ctx: Rank) -> dict:
    import threading
    import time

    import torch

    import reloadpg_autopatch as rpg

    dist = run_events.begin(ctx, registered=False)
    pair = dist.new_group([0, 1])
    box: dict[str, Any] = {}
    if ctx.rank == 0:

        def stuck() -> None:  # rank 1 never joins this all_reduce
            started = time.monotonic()
            try:
                dist.all_reduce(torch.ones(1), group=pair)
                box["outcome"] = "no error"
            except Exception as error:
                box["outcome"] = f"{type(error).__name__}: {error}"
            box["seconds"] = time.monotonic() - started

        worker = threading.Thread(target=stuck, daemon=True)
        worker.start()
    time.sleep(1.0)  # the worker is blocked in the collective; both ranks destroy now
    rpg.destroy_process_groups()
    if ctx.rank == 0:
        worker.join(20)
        box.setdefault("outcome", "hang: still blocked 20 s after destroy")
    rpg.reload_process_groups()
    box["sum"] = total(pair, 1)
    return box


def test_a_thread_in_a_collective_on_a_destroyed_group_gets_the_packages_error() -> None:
    for attempt in range(3):  # the race had two outcomes in four runs: try it more than once
        reports = run_ranks(_collective_during_destroy, 2, timeout=120, env=GATE)
        outcome = reports[0]["outcome"]
        assert "reload_process_groups()" in outcome, (attempt, outcome)
        assert [r["sum"] for r in reports] == [2.0, 2.0]


def _explicit_world_destroy(ctx: Rank) -> dict:
    import torch

    import reloadpg_autopatch as rpg

    dist = run_events.begin(ctx, registered=True)
    pair = dist.new_group([0, 1])
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    dist.destroy_process_group(dist.group.WORLD)  # WORLD named explicitly: its stand-in
    out: dict[str, Any] = {"initialized": dist.is_initialized()}
    try:
        dist.all_reduce(torch.ones(1), group=pair)
        out["old group"] = "no error"
    except RuntimeError as error:
        out["old group"] = str(error)
    ctx.reinit("after-explicit-destroy/", run_events.TIMEOUT)
    out["new world"] = total(dist.new_group([0, 1]), 1)
    return out


def test_destroying_world_by_name_ends_the_world() -> None:
    """``destroy_process_group(dist.group.WORLD)`` is the program ending its world, as with no
    argument: torch says it is no longer initialized, old groups say so, a new world works."""
    for report in run_ranks(_explicit_world_destroy, 2, env=GATE):
        assert report["initialized"] is False, report
        assert "destroy" in report["old group"], report
        assert "WORLD" in report["old group"], report
        assert report["new world"] == 2.0
