"""The lifecycle at run length (issue 9), on real gloo ranks.

An RL run destroys and reloads its groups thousands of times, on ranks seconds apart, while it
creates and drops groups of its own. Every oracle here observes torch, never our counters: a spy
on ``distributed_c10d._new_process_group_helper`` counts the native groups torch builds,
``_world.pg_map`` says which ones exist and under which store prefix each met its peers, and
collective results are computed by hand. Only the fork tests name internals (the locks), all in
``_fork_cases``.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.support import patched_ranks
from tests.support.ranks import Rank, errors_of, pg_count, run_ranks, total

pytestmark = pytest.mark.timeout(300)

#: How long the late rank sleeps; every store and group timeout below is well above it.
SKEW_S = 1.0
STEPS = 50


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


def _rendezvous_prefixes() -> list[str]:
    """The full store prefix each live group but WORLD made its rendezvous under.

    torch keeps each group's store in ``_world.pg_map``: a probe key written through it shows
    the prefix on the root store, whatever ``PrefixStore`` layers sit in between.
    """
    import os

    from torch.distributed import distributed_c10d as c10d

    default = c10d._get_default_group()
    prefixes = []
    for pg, (_, store) in list(c10d._world.pg_map.items()):
        if pg is default or pg is getattr(default, "group", None):  # WORLD (or behind its stand-in)
            continue
        probe = f"run-length-probe-{os.getpid()}-{id(pg)}"
        store.set(probe, "1")
        root = store._underlying_non_prefix_store
        key = next(k for k in root.list_keys() if k.endswith(probe))
        root.delete_key(key)
        prefixes.append(key[: -len(probe)])
    return sorted(prefixes)


# ---- 1. skewed arrival ---------------------------------------------------------------------

KINDS = {
    "plain": ({}, False),
    "local-sync": ({"use_local_synchronization": True}, False),
    "plain+WORLD": ({}, True),
    "local-sync+WORLD": ({"use_local_synchronization": True}, True),
}


def _skewed(ctx: Rank, kind: str) -> dict:
    import time

    import reloadpg_autopatch as rpg

    kwargs, registered = KINDS[kind]
    dist = patched_ranks.start(ctx, registered)
    spy = patched_ranks.NativeSpy()
    first = dist.new_group([0, 1], timeout=patched_ranks.TIMEOUT, **kwargs)
    second = dist.new_group([0, 1], timeout=patched_ranks.TIMEOUT, **kwargs)
    report: dict[str, Any] = {"before": [total(first, 1), total(second, 10)]}
    seen = set(_rendezvous_prefixes())
    cycles = []
    for cycle in range(3):
        late = ctx.rank == (1 if cycle % 2 == 0 else 0)  # each rank is the late one in turn
        if late:
            time.sleep(SKEW_S)
        rpg.destroy_process_groups()
        if late:
            time.sleep(SKEW_S)
        created = spy.during(rpg.reload_process_groups)
        prefixes = _rendezvous_prefixes()
        cycles.append(
            {
                "sums": [total(first, ctx.rank + 1), total(second, 10 * ctx.rank)],
                "created": created,
                "pg_count": pg_count(),
                "prefixes": len(prefixes),
                "reused": [p for p in prefixes if p in seen],
            }
        )
        seen.update(prefixes)
    report["cycles"] = cycles
    report["registered"] = registered
    return report


@pytest.mark.parametrize("kind", list(KINDS))
def test_skewed_ranks_reload_every_kind_of_group(kind: str) -> None:
    """Ranks reach destroy and reload seconds apart, as they do in a real run.

    A local-sync group's hashed name is reused by its replay, so the early rank can read the
    late rank's previous (closed) address from the store: ``connectFullMesh failed``. Whether
    it does depends on which side of the gloo pair connects, so the rendezvous prefixes are
    checked too: no generation may use a key prefix that an earlier one used.
    """
    reports = run_ranks(functools.partial(_skewed, kind=kind), 2, timeout=200)
    for report in reports:
        world = 1 if report["registered"] else 0
        assert report["before"] == [2.0, 20.0]
        for cycle in report["cycles"]:
            assert cycle["reused"] == [], "a reload reused an earlier generation's store keys"
            assert cycle["prefixes"] == 2
            assert cycle["sums"] == [3.0, 10.0]  # (0 + 1) + (1 + 1); 10 * 0 + 10 * 1
            assert cycle["created"] == 2 + world
            assert cycle["pg_count"] == 3  # WORLD and the two groups


# ---- 2. run length: the registry stays bounded by the live groups ---------------------------


def _run_length(ctx: Rank, registered: bool) -> dict:
    import gc
    import time

    import torch

    import reloadpg_autopatch as rpg

    dist = patched_ranks.start(ctx, registered)
    spy = patched_ranks.NativeSpy()
    held = [dist.new_group([0, 1]), dist.new_group([0, 1])]
    expected = len(held) + registered
    report: dict[str, Any] = {"created": [], "destroy_created": [], "ms": [], "bad": []}
    for step in range(STEPS):
        pairs = [dist.new_group([0, 1]) for _ in range(3)]
        singles = [dist.new_group([r]) for r in range(2)]  # a member of one, not of the other
        mine = singles[ctx.rank]
        sums = [total(g, ctx.rank + 1) for g in pairs] + [total(mine, 5)]
        if sums != [3.0, 3.0, 3.0, 5.0]:
            report["bad"].append((step, "temporary sums", sums))
        # Released on every rank, or simply dropped (as Megatron's destroy_model_parallel does).
        dist.destroy_process_group(pairs[0])
        dist.destroy_process_group(pairs[1])
        if ctx.rank == 0:
            dist.destroy_process_group(mine)
        del pairs, singles, mine
        gc.collect()
        started = time.perf_counter()
        report["destroy_created"].append(spy.during(rpg.destroy_process_groups))
        created = spy.during(rpg.reload_process_groups)
        report["ms"].append((time.perf_counter() - started) * 1e3)
        report["created"].append(created)
        held_sums = [total(g, ctx.rank + 1) for g in held]
        if held_sums != [3.0, 3.0] or pg_count() != len(held) + 1:
            report["bad"].append((step, "held groups", held_sums, pg_count()))
        # Stop together soon after a deviation (a few steps show the trend): a growing
        # registry makes every step slower, and a misaligned name would hang the next one.
        drifted = created != expected and step >= 3
        stop = torch.tensor([float(drifted or bool(report["bad"]))])
        dist.all_reduce(stop)
        if stop.item():
            break
    report["expected"] = expected
    return report


@pytest.mark.parametrize("registered", [False, True], ids=["subgroups", "WORLD"])
def test_native_groups_per_reload_stay_constant_over_50_steps(registered: bool) -> None:
    """Each step creates, uses and releases temporary groups, then cycles.

    Released or dropped groups must not be rebuilt: the native groups torch builds per reload
    equal the groups the program still holds (plus WORLD when it is swapped).

    About 10 s: 50 steps of creations, collectives and cycles; fewer would not show a slow
    growth.
    """
    for report in run_ranks(functools.partial(_run_length, registered=registered), 2, timeout=280):
        created = report["created"]
        assert report["bad"] == []
        assert created == [report["expected"]] * STEPS, f"native groups per reload: {created}"
        assert report["destroy_created"] == [int(registered)] * STEPS  # the temporary WORLD
        print(
            f"destroy+reload: first {report['ms'][0]:.1f} ms, "
            f"last {report['ms'][-1]:.1f} ms, max {max(report['ms']):.1f} ms"
        )


def _groups_held_by(module: Any, group_class: type) -> list[str]:
    """The names of a module's globals that still hold a group (in a list or dict too)."""
    seen, names = set(), []
    for name, value in sorted(vars(module).items()):
        values = value.values() if isinstance(value, dict) else value
        for item in values if isinstance(values, (list, tuple)) else [value]:
            if isinstance(item, group_class) and id(item) not in seen:
                seen.add(id(item))
                names.append(name)
    return names


def _megatron_dropped(ctx: Rank, registered: bool) -> dict:
    import gc

    import reloadpg_autopatch as rpg

    dist = patched_ranks.start(ctx, registered)
    from megatron.core import parallel_state

    keep = dist.new_group([0, 1])
    spy = patched_ranks.NativeSpy()

    def cycle() -> int:
        rpg.destroy_process_groups()
        return spy.during(rpg.reload_process_groups)

    made = spy.during(lambda: parallel_state.initialize_model_parallel(2))
    tp = parallel_state.get_tensor_model_parallel_group()
    report = {"made": made, "live_cycle": cycle(), "tp_sum": total(tp, ctx.rank + 1)}
    del tp
    parallel_state.destroy_model_parallel()
    gc.collect()
    # Held and not destroyed: Megatron destroys the gloo groups it finds in torch's pg_map
    # (and forgets to reset one global of them), so ask torch which ones it still knows.
    from torch.distributed import distributed_c10d as c10d

    report["still_held"] = [
        name
        for name in _groups_held_by(parallel_state, dist.ProcessGroup)
        if getattr(parallel_state, name) in c10d._world.pg_map
    ]
    report["after"] = [cycle(), cycle()]
    report["keep_sum"] = total(keep, ctx.rank + 1)
    report["pg_count"] = pg_count()
    return report


@pytest.mark.parametrize("registered", [False, True], ids=["subgroups", "WORLD"])
def test_megatrons_dropped_groups_are_not_rebuilt(registered: bool) -> None:
    """``destroy_model_parallel`` only drops Megatron's groups; a cycle must not rebuild them.

    megatron-core 0.16.1 forgets to reset ``_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP`` (and
    its gloo twin): those are still held, so they are still rebuilt.
    """
    world = int(registered)
    for report in run_ranks(
        functools.partial(_megatron_dropped, registered=registered), 2, timeout=200
    ):
        held = 1 + len(report["still_held"])  # `keep` and what Megatron did not let go
        assert report["made"] > 10  # Megatron's whole set
        assert report["live_cycle"] == report["made"] + 1 + world  # all of it, and `keep`
        assert report["tp_sum"] == 3.0
        assert len(report["still_held"]) < report["made"] // 2
        assert report["after"] == [held + world] * 2, (
            f"natives rebuilt for dropped groups (still held: {report['still_held']})"
        )
        assert report["keep_sum"] == 3.0
        assert report["pg_count"] == 1 + held


def _asymmetric_drop(ctx: Rank) -> dict:
    import gc

    import reloadpg_autopatch as rpg

    dist = ctx.patched("all")
    spy = patched_ranks.NativeSpy()
    before = dist.new_group([0, 1])
    middle = dist.new_group([0, 1])
    after = dist.new_group([0, 1])
    if ctx.rank == 0:
        del middle  # rank 1 still holds it: the record is not dead yet
        gc.collect()
    rpg.destroy_process_groups()
    report = {"first": spy.during(rpg.reload_process_groups)}
    report["sums"] = [total(g, ctx.rank + 1) for g in (before, after)]
    if ctx.rank == 1:
        report["middle_size"] = dist.get_world_size(middle)  # rebuilt for the rank that holds it
        del middle  # now dead on every rank
        gc.collect()
    rpg.destroy_process_groups()
    report["second"] = spy.during(rpg.reload_process_groups)
    report["sums_second"] = [total(g, ctx.rank + 1) for g in (before, after)]
    return report


def test_a_group_dropped_on_one_rank_only_keeps_names_aligned() -> None:
    """Ranks agree on dead records before skipping them, or later groups get mismatched names."""
    reports = run_ranks(_asymmetric_drop, 2, timeout=120)
    for report in reports:
        assert report["sums"] == [3.0, 3.0]
        assert report["sums_second"] == [3.0, 3.0]
        assert report["second"] == 2, "a group dropped on every rank was rebuilt"
    assert reports[1]["first"] == 3
    assert reports[1]["middle_size"] == 2


# ---- 3. the program tears WORLD down and initializes it again -------------------------------


def _teardown(ctx: Rank, registered: bool) -> dict:
    import torch

    import reloadpg_autopatch as rpg

    dist = patched_ranks.start(ctx, registered)
    old = dist.new_group([0, 1])
    old_single = [dist.new_group([r]) for r in range(2)][ctx.rank]
    report: dict[str, Any] = {"old_sum": total(old, ctx.rank + 1)}

    dist.destroy_process_group()  # the program ends its world itself
    ctx.reinit("second-world/", patched_ranks.TIMEOUT, store_timeout=patched_ranks.TIMEOUT)
    if registered:
        rpg.register_default_process_group(patched_ranks.TIMEOUT, accelerator_backends=("gloo",))
    spy = patched_ranks.NativeSpy()
    new = dist.new_group([0, 1])

    def old_errors() -> dict:
        return errors_of(
            {
                "all_reduce": lambda: dist.all_reduce(torch.ones(1), group=old),
                "get_world_size": lambda: dist.get_world_size(old),
                "method": old.rank,
                "property": lambda: old.group_name,
                "single": lambda: dist.all_reduce(torch.ones(1), group=old_single),
            }
        )

    report["right_after_init"] = old_errors()
    cycles = []
    for _ in range(3):
        rpg.destroy_process_groups()
        created = spy.during(rpg.reload_process_groups)
        cycles.append(
            {
                "created": created,
                "new_sum": total(new, ctx.rank + 1),
                "world_sum": total(None, ctx.rank + 1),
                "old": old_errors(),
            }
        )
    report["cycles"] = cycles
    return report


def _says_world_destroyed(message: str) -> bool:
    text = message.lower()
    return "world" in text and "destroy" in text


@pytest.mark.parametrize("registered", [False, True], ids=["subgroups", "WORLD"])
def test_groups_of_a_torn_down_world_stay_dead(registered: bool) -> None:
    """After the program destroys WORLD and initializes again, a reload revives nothing old."""
    world = int(registered)
    for report in run_ranks(functools.partial(_teardown, registered=registered), 2, timeout=150):
        assert report["old_sum"] == 3.0
        revived = [c["old"] for c in report["cycles"] if "no error" in c["old"].values()]
        assert revived == [], "a group of the torn-down world came back to life"
        for errors in [report["right_after_init"]] + [c["old"] for c in report["cycles"]]:
            for label, message in errors.items():
                assert _says_world_destroyed(message), f"{label}: {message}"
        for cycle in report["cycles"]:
            assert cycle["new_sum"] == 3.0
            assert cycle["world_sum"] == 3.0
            assert cycle["created"] == 1 + world  # the new world's group (and WORLD) only


# ---- 4. shims over new_group ----------------------------------------------------------------


def _pass_through_shim(ctx: Rank) -> dict:
    import reloadpg_autopatch as rpg

    dist = ctx.patched("all")
    spy = patched_ranks.NativeSpy()
    calls = []
    inner = dist.new_group

    def logged(*args: Any, **kwargs: Any) -> Any:  # a logging layer applied after ours
        calls.append(args)
        return inner(*args, **kwargs)

    dist.new_group = logged
    made = {}
    group = None

    def create() -> None:
        nonlocal group
        group = dist.new_group([0, 1])

    made["natives"] = spy.during(create)
    report = {
        "calls": len(calls),
        "natives": made["natives"],
        "reloadable": isinstance(group, rpg.ReloadableProcessGroup),
        "sum": total(group, ctx.rank + 1),
    }
    rpg.destroy_process_groups()
    report["pg_count_destroyed"] = pg_count()
    report["reloaded"] = spy.during(rpg.reload_process_groups)
    report["sum_after"] = total(group, ctx.rank + 1)
    return report


def test_a_pass_through_shim_keeps_groups_reloadable() -> None:
    """A logging or profiling layer over ``new_group`` must not turn reloadability off."""
    for report in run_ranks(_pass_through_shim, 2, timeout=120):
        assert report["calls"] == 1
        assert report["natives"] == 1  # one native per call: not created twice
        assert report["reloadable"], "new_group returned a native group through the shim"
        assert report["sum"] == 3.0
        assert report["pg_count_destroyed"] == 1  # its communicator was freed
        assert report["reloaded"] == 1
        assert report["sum_after"] == 3.0


def _declared_layer(ctx: Rank) -> dict:
    import logging

    import reloadpg_autopatch as rpg
    from tests.support.programs import slime_like

    class Capture(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    capture = Capture()
    logging.getLogger("reloadpg_autopatch").addHandler(capture)
    dist = ctx.patched("all")
    spy = patched_ranks.NativeSpy()
    native_class = type(dist.GroupMember.WORLD)
    slime_class, slime_destroy, slime_reload = slime_like.apply()
    layer = dist.new_group
    theirs = dist.new_group([0, 1])
    report = {
        "natives": spy.created,
        "theirs": type(theirs).__name__,
        "inner_is_native": type(theirs.group) is native_class,
        "sum": total(theirs, ctx.rank + 1),
        "layer": [layer.__module__, layer.__qualname__],
    }
    rpg.destroy_process_groups()  # theirs is not ours: it stays alive
    rpg.reload_process_groups()
    report["sum_after_our_cycle"] = total(theirs, ctx.rank + 1)
    slime_destroy()
    slime_reload()
    report["sum_after_their_cycle"] = total(theirs, ctx.rank + 1)
    report["inner_is_native_after"] = type(theirs.group) is native_class
    report["is_slime_class"] = isinstance(theirs, slime_class)
    report["warnings"] = capture.messages
    return report


def test_a_layer_that_declares_it_wraps_gets_native_groups_and_a_warning() -> None:
    """slime's patch sets ``torch.distributed.old_new_group``: it owns wrapping, we step back."""
    for report in run_ranks(_declared_layer, 2, timeout=120):
        assert report["natives"] == 1
        assert report["theirs"] == "SlimeLikeGroup"
        assert report["inner_is_native"], "wrapped twice"
        assert report["is_slime_class"]
        assert report["sum"] == 3.0
        assert report["sum_after_our_cycle"] == 3.0
        assert report["sum_after_their_cycle"] == 3.0
        assert report["inner_is_native_after"]
        module, qualname = report["layer"]
        named = [m for m in report["warnings"] if module in m or qualname in m]
        assert named, f"no warning names the layer {module}.{qualname}: {report['warnings']}"


# ---- 5. fork while another thread holds an internal lock ------------------------------------

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

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch._startup import finder as hook

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


def _world_replaced_behind_our_back(ctx: Rank) -> dict:
    import inspect

    import torch

    import reloadpg_autopatch as rpg

    dist = patched_ranks.start(ctx, registered=False)
    old = dist.new_group([0, 1])
    inspect.unwrap(dist.destroy_process_group)()  # torch's own, as a stale binding would call it
    ctx.reinit("replaced-world/", patched_ranks.TIMEOUT, store_timeout=patched_ranks.TIMEOUT)
    spy = patched_ranks.NativeSpy()
    new = dist.new_group([0, 1])
    cycles = []
    for _ in range(2):
        rpg.destroy_process_groups()
        cycle: dict[str, Any] = {"created": spy.during(rpg.reload_process_groups)}
        cycle["new_sum"] = total(new, ctx.rank + 1)
        try:
            dist.all_reduce(torch.ones(1), group=old)
            cycle["old"] = "no error"
        except RuntimeError as error:
            cycle["old"] = str(error)
        cycles.append(cycle)
    return {"cycles": cycles}


def test_a_world_replaced_behind_our_back_ends_its_groups() -> None:
    """torch's unpatched destroy tears WORLD down without telling us; the next world's reload
    must rebuild only its own groups and the old ones must say their world is gone."""
    for report in run_ranks(_world_replaced_behind_our_back, 2, timeout=120):
        for cycle in report["cycles"]:
            assert cycle["created"] == 1
            assert cycle["new_sum"] == 3.0
            assert _says_world_destroyed(cycle["old"]), cycle["old"]
