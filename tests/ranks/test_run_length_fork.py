"""Fork at every point of a run: a child neither crashes, hangs, nor touches its parent's world.

Data-loader and pool workers fork before, between and after cycles; a child forked inside a
step neither crashes nor hangs; a forked child never touches its parent's groups, can take every
lock of the package (each is re-made in the child, even one another thread held), leaves the
parent's world alone, and a grandchild belongs to its parent's world, not its grandparent's.

The oracles are the OS's and torch's: a child's exit status, collective results, the store's
key count; only the lock test names internals (the locks, in ``_fork_cases``).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest

from tests.support import accelerator, patched_ranks, run_events
from tests.support.ranks import GATE, Rank, run_ranks, total

pytestmark = pytest.mark.timeout(300)

# ---- a forked child and its parent's groups ------------------------------------------------------


def _fork_probe(ctx: Rank) -> dict:
    import json
    import os

    import reloadpg_autopatch
    from reloadpg_autopatch.groups import registry

    dist = ctx.patched()
    group = dist.new_group([0])
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running the parent's cleanup
        try:
            reloadpg_autopatch.destroy_process_groups()  # must not touch the parent's groups
            view = [len(registry.records()), group.group is not None]
            os.write(write_end, json.dumps(view).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        child_view = json.loads(pipe.read() or "null")
    _, status = os.waitpid(pid, 0)
    return {
        "child": child_view,
        "parent_live": group.group is not None,
        "code": os.waitstatus_to_exitcode(status),
    }


@pytest.mark.timeout(240)
def test_forked_child_never_touches_the_parents_groups() -> None:
    (report,) = run_ranks(_fork_probe, 1)
    assert report["child"] == [0, True]
    assert report["parent_live"]
    assert report["code"] == 0


# ---- fork workers, and a fork inside a step ------------------------------------------------------


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


# ---- fork while another thread holds an internal lock --------------------------------------------


def _fork_cases(finder: Any, module_name: str) -> dict[str, tuple[Any, Any]]:
    """Each internal lock, by role: (how to get it now, a public call that takes it).

    The only place that names internals: update it when the implementation renames them.
    """
    import importlib

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.groups import process, registry, settings
    from reloadpg_autopatch.patching import patchset as state

    return {
        "patch": (lambda: state.LOCK, rpg.monkey_patch_torch_dist),
        "finder": (lambda: finder._lock, lambda: importlib.import_module(module_name)),
        "registry": (registry.lock, rpg.destroy_process_groups),
        "settings": (lambda: settings.current().lock, lambda: rpg.set_reload_mode("wrapper")),
        "holder": (lambda: process._CREATE, process.current),
    }


def _every_public_call(group: Any) -> list[str]:
    """Call every public function that a forked child may call; return what failed.

    The child holds none of its parent's groups: its cycle report is None, destroy and reload
    do nothing, and the program's choices (mode, policy, guard, hooks) are its parent's.
    """
    import reloadpg_autopatch as rpg

    failed = []
    handle = None
    calls = {
        "monkey_patch_torch_dist": rpg.monkey_patch_torch_dist,
        "is_patched": lambda: rpg.is_patched() or 1 / 0,
        "patched_names": lambda: rpg.patched_names() or 1 / 0,
        "rebind": rpg.rebind,
        "find_stale": rpg.find_stale,
        "unwrap": lambda: rpg.unwrap(group),
        "reloadable_groups": rpg.reloadable_groups,
        "destroy_process_groups": rpg.destroy_process_groups,
        "reload_process_groups": rpg.reload_process_groups,
        "set_wrap_policy": lambda: rpg.set_wrap_policy(rpg.get_wrap_policy()),
        "set_reload_mode": lambda: rpg.set_reload_mode(rpg.get_reload_mode()),
        "set_memory_guard": lambda: rpg.set_memory_guard(rpg.get_memory_guard().min_free_gb),
        "set_memory_probe": lambda: rpg.set_memory_probe(None),
        "last_cycle_report is None": lambda: rpg.last_cycle_report() is None or 1 / 0,
    }
    for name, call in calls.items():
        try:
            call()
        except Exception as error:
            failed.append(f"{name}: {type(error).__name__}: {error}")
    try:
        handle = rpg.add_reload_hook(after_reload=lambda groups: None, name="child")
        handle.remove()
    except Exception as error:
        failed.append(f"add_reload_hook: {type(error).__name__}: {error}")
    return failed


#: Stdlib modules that a rank has no reason to import; the hook needs one not imported yet.
_UNIMPORTED = ("colorsys", "sndhdr", "imghdr", "xdrlib", "nntplib", "wave")


def _fork_with_lock_held(ctx: Rank, role: str) -> dict:
    import json
    import os
    import select
    import signal
    import sys
    import threading
    import time

    import _reloadpg_autopatch_boot as hook
    import reloadpg_autopatch as rpg

    dist = ctx.patched("all")
    group = dist.new_group([0])
    rpg.destroy_process_groups()  # the parent has a cycle report; the child must not
    rpg.reload_process_groups()
    module_name = next(m for m in _UNIMPORTED if m not in sys.modules)
    fired: list[str] = []
    finder = hook.install(module_name, lambda: fired.append(module_name))
    get_lock, call = _fork_cases(finder, module_name)[role]

    lock = get_lock()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(10), "the holder thread never got the lock"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the holder thread does not exist here
        try:
            os.close(read_end)
            try:
                call()
                outcome = "ok"
            except Exception as error:
                outcome = f"{type(error).__name__}: {error}"
            kept = group.group is not None
            view = {
                "outcome": outcome,
                "fired": fired,
                "parent_group_kept": kept,
                "public": _every_public_call(group),
            }
            os.write(write_end, json.dumps(view).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    release.set()
    holder.join(10)
    ready, _, _ = select.select([read_end], [], [], 20)
    if ready:
        with os.fdopen(read_end) as pipe:
            child = json.loads(pipe.read() or '{"outcome": "died without a report"}')
        os.waitpid(pid, 0)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_end)
        child = {"outcome": "deadlock: no answer within 20 s"}
    started = time.monotonic()
    call()  # the parent still can, once the holder let go
    return {"child": child, "module": module_name, "parent_s": time.monotonic() - started}


@pytest.mark.parametrize("role", ["patch", "finder", "registry", "settings", "holder"])
def test_a_forked_child_can_take_every_lock(role: str) -> None:
    """A fork taken while another thread holds a lock copies it held, with no one to release it.

    Every lock of the package is re-made in a forked child: the child can still use every
    public function, and its cycle report is None (its parent's cycles are not its own).
    """
    (report,) = run_ranks(functools.partial(_fork_with_lock_held, role=role), 1, timeout=120)
    assert report["child"]["outcome"] == "ok", report["child"]["outcome"]
    assert report["child"]["public"] == [], report["child"]["public"]
    if role == "finder":
        assert report["child"]["fired"] == [report["module"]]  # the hook still works there
    assert report["child"]["parent_group_kept"]


# ---- the parent's world, and a grandchild's ------------------------------------------------------


def _fork_with_world_registered(ctx: Rank) -> dict:
    import json
    import os
    import select
    import signal

    import reloadpg_autopatch as rpg

    dist = patched_ranks.start(ctx, registered=True)
    group = dist.new_group([0, 1])
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child inherits the parent's memory, not its groups nor its WORLD
        try:
            os.close(read_end)
            try:
                rpg.destroy_process_groups()
                rpg.reload_process_groups()
                outcome = "ok"
            except Exception as error:
                outcome = f"{type(error).__name__}: {error}"
            os.write(write_end, json.dumps(outcome).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    ready, _, _ = select.select([read_end], [], [], 20)
    if ready:
        with os.fdopen(read_end) as pipe:
            child = json.loads(pipe.read() or '"died without a report"')
    else:
        os.kill(pid, signal.SIGKILL)
        os.close(read_end)
        child = "hang: no answer within 20 s (did the child join the parent's WORLD swap?)"
    os.waitpid(pid, 0)
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    return {
        "child": child,
        "group_sum": total(group, ctx.rank + 1),
        "world_sum": total(None, ctx.rank + 1),
    }


def test_a_forked_child_leaves_the_parents_world_alone() -> None:
    """Per-process state: a child's cycle must not take part in the parent's WORLD swap."""
    for report in run_ranks(_fork_with_world_registered, 2, timeout=120):
        assert report["child"] == "ok"
        assert report["group_sum"] == 3.0
        assert report["world_sum"] == 3.0


def _grandchild(ctx: Rank) -> dict[str, Any]:
    import json
    import os
    import select
    import signal

    from torch.distributed import distributed_c10d as c10d

    _torch, dist, rpg, _s = accelerator.start(ctx, "wrapper", policy="all")
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # a child that leaves its parent's world and starts its own
        said: dict[str, Any] = {}
        try:
            c10d._world.default_pg = None  # left without running the parent's destructors
            store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
            dist.init_process_group("gloo", store=store, rank=0, world_size=1)
            group = dist.new_group([0])
            said["keys before"] = store.num_keys()
            grandchild = os.fork()
            if grandchild == 0:  # forked inside the child's world, holding none of its groups
                try:
                    rpg.destroy_process_groups()
                    rpg.reload_process_groups()
                finally:
                    os._exit(0)
            os.waitpid(grandchild, 0)
            said["keys after"] = store.num_keys()
            rpg.destroy_process_groups()  # the child's own cycle still works
            rpg.reload_process_groups()
            said["child sum"] = accelerator.rank_sum(dist, _torch, 0, group)
        except Exception as error:
            said["error"] = repr(error)
        finally:
            os.write(write_end, json.dumps(said).encode())
            os._exit(0)
    os.close(write_end)
    ready, _, _ = select.select([read_end], [], [], 60)
    if not ready:
        os.kill(child, signal.SIGKILL)
    with os.fdopen(read_end) as pipe:
        said = json.loads(pipe.read() or "{}")
    os.waitpid(child, 0)
    return said


@pytest.mark.timeout(240)
def test_a_grandchild_belongs_to_its_parents_world_not_its_grandparents() -> None:
    """A forked child leaves its parent's world, starts its own (one rank, on a TCPStore it
    hosts) and makes a reloadable group; a grandchild forked there holds none of the child's
    groups, so its destroy and reload must not take part in the child's steps: the child's
    store holds the same keys after the grandchild's cycle (``num_keys()``), and the child's
    own cycle still works."""
    (out,) = accelerator.run_once(_grandchild, 1)
    assert "error" not in out, out
    assert out["keys after"] == out["keys before"], out
    assert out["child sum"] == 1.0
