"""A whole run, as measured: what the package does to a job over many cycles, on real gloo ranks.

Every rank is activated by ``SLIME_RELOADABLE_PG=1`` in its environment alone (the mode by
``SLIME_RELOADABLE_PG_MODE``), as users run it; ranks are forked from a warm parent
(``tests/support/ranks.py``). ``wrapper`` registers WORLD and swaps it for a temporary gloo WORLD,
as an NCCL WORLD is on a GPU; ``suspend`` and ``auto`` put their groups on the package's CPU model
of NCCL's suspend (``reloadpg_autopatch/tools/cpu_nccl``: gloo that models it), WORLD on gloo. The
oracles are outside the package: a TCPStore this process owns (``num_keys()``), torch's results
against a gate-off control, exit statuses, the clock, ``/proc/self``.

Parts: 1 fork-start workers while the groups sleep; 2 a rank killed in a reload (the
survivors' error and its delay); 3 a fresh process taking the dead rank's place; 4 a compiled
step over 20 cycles against a gate-off control; 5 threads as ranks (the suite's scenario); 6
the store cost per rank at 4,096 simulated ranks (``benchmarks.scale``'s point); 7 the
process-global state after ``--cycles`` cycles, and the same run under the program's own
repeating faulthandler timer; 8 the store's keys at cycles 0, 1, 50 and the end, beside torch
re-creating the groups itself.

``python -m benchmarks.whole_run [--cycles N] [--out FILE.json]``: ``--cycles`` sets the long
runs of parts 7 and 8 (default 200: 2.5 minutes in all on 2 busy cores; the saved figures used
1,000, 7 minutes on a busy machine). ``--parts fork,kill`` runs a subset.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks import stats
from benchmarks.stats import Row, table
from tests.support.ranks import GATE, HOST, Rank, run_ranks

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MODES = ("wrapper", "suspend", "auto")
#: WORLD's timeout in the kill run: what a survivor waits out at most.
KILL_WORLD_S = 3.0
#: The suspend watchdog's timeout in the kill run (a rank alone in a resume ends this soon).
KILL_WATCHDOG_S = "6"
KEY_CYCLES = 50
COMPILED_CYCLES = 20
#: The program's faulthandler timer in the timer part: a hang detector that repeats.
TIMER_S = 2.0


def _env(mode: str, **extra: str) -> dict[str, str | None]:
    return {**GATE, "SLIME_RELOADABLE_PG_MODE": mode, **extra}


def _error(error: BaseException) -> dict[str, Any]:
    """An error's type, the package's error classes it is an instance of, and its first line."""
    from reloadpg_autopatch import errors

    ours = [
        name
        for name in dir(errors)
        if isinstance(getattr(errors, name), type)
        and issubclass(getattr(errors, name), BaseException)
        and isinstance(error, getattr(errors, name))
    ]
    return {"type": type(error).__name__, "is": sorted(ours), "text": str(error)[:300]}


# ---- what every rank shares -----------------------------------------------------------------


def _start(
    ctx: Rank, mode: str, *, world_size: int | None = None, prefix: str = "", timeout: float = 30.0
) -> tuple[Any, Any, dict[str, Any]]:
    """Join WORLD on ``ctx``'s store (under ``prefix``), make the mode's groups; return
    (torch.distributed, the package, the groups by name)."""
    import multiprocessing
    import warnings

    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.tools import cpu_nccl as s

    warnings.simplefilter("ignore", FutureWarning)
    multiprocessing.current_process().daemon = False  # a training rank may have children
    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    assert rpg.get_reload_mode() == mode, rpg.get_reload_mode()
    s.register()
    rpg.set_wrap_policy("all")
    rpg.set_memory_guard(0)
    size = world_size or ctx.world_size
    client = dist.TCPStore(ctx.host, ctx.port, size, is_master=False, timeout=timedelta(seconds=60))
    store = dist.PrefixStore(prefix, client) if prefix else client
    dist.init_process_group(
        "gloo", store=store, rank=ctx.rank, world_size=size, timeout=timedelta(seconds=timeout)
    )
    ranks = list(range(size))
    if mode == "wrapper":
        rpg.register_default_process_group(
            timedelta(seconds=timeout), accelerator_backends=("gloo",)
        )
        groups = {"pair": dist.new_group(ranks[:2]), "all": dist.new_group(ranks)}
    else:
        groups = {
            "standin-pair": dist.new_group(ranks[:2], backend=s.NAME_A, group_desc="tp"),
            "standin-all": dist.new_group(ranks, backend=s.NAME_A, group_desc="dp"),
        }
        if mode == "auto":  # gloo cannot suspend: auto mode takes it behind a wrapper
            groups["gloo-all"] = dist.new_group(ranks, group_desc="cpu")
    return dist, rpg, groups


def _sums_ok(dist: Any, groups: dict[str, Any], rank: int) -> bool:
    """One all_reduce on every group, WORLD included: does each give the right sum?"""
    import torch

    ok = True
    for group in [None, *groups.values()]:
        if dist.get_rank(group) < 0:
            continue  # not a member of this one
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, group=group)
        members = range(dist.get_world_size(group))
        ranks = members if group is None else dist.get_process_group_ranks(group)
        ok &= t.item() == float(sum(r + 1 for r in ranks))
    return ok


def _own(ctx: Rank, port: int) -> Rank:
    return dataclasses.replace(ctx, port=port)


# ---- 1. fork-start workers while the groups sleep -------------------------------------------


def _child_work(x: int) -> dict[str, Any]:
    """What a fork worker does: torch work, and what the package and torch say it holds."""
    import torch
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    return {
        "pid": os.getpid(),
        "value": float(torch.arange(4.0).sum()) + x * x,
        "initialized": dist.is_initialized(),
        "reloadable": len(rpg.reloadable_groups()),
    }


def _child_cycle(_: int) -> dict[str, Any]:
    """A fork worker that calls destroy and reload: it holds none of its parent's groups."""
    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.tools import cpu_nccl as s

    calls = len(s.CALLS)  # the stand-in's log, inherited: grows if the child drives a backend
    started = time.monotonic()
    try:
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        outcome: Any = "returned"
    except Exception as error:
        outcome = _error(error)
    seconds = time.monotonic() - started
    return {"outcome": outcome, "seconds": seconds, "backend_calls": len(s.CALLS) - calls}


def _fork_asleep(ctx: Rank, mode: str, port: int) -> dict[str, Any]:
    import multiprocessing

    from tests.support import run_events  # forks: a DataLoader, a pool and a bare fork

    ctx = _own(ctx, port)
    dist, rpg, groups = _start(ctx, mode)
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    rpg.destroy_process_groups()  # asleep from here
    client = dist.TCPStore(ctx.host, ctx.port, ctx.world_size, is_master=False)
    dist.barrier()  # both ranks are done destroying: the keys stand still
    keys_before = client.num_keys()
    out: dict[str, Any] = {"forks": run_events.forks("asleep")}
    with multiprocessing.get_context("fork").Pool(2) as pool:
        out["workers"] = pool.map_async(_child_work, range(4)).get(timeout=60)
        try:
            out["worker_cycle"] = pool.apply_async(_child_cycle, (0,)).get(timeout=30)
        except multiprocessing.TimeoutError:
            out["worker_cycle"] = "hang: no answer within 30 s"
    out["store_keys_before_after_children"] = [keys_before, client.num_keys()]
    dist.barrier()  # no rank reloads before every rank has counted
    started = time.monotonic()
    rpg.reload_process_groups()
    out["reload_after_s"] = time.monotonic() - started
    out["sums_ok_after_reload"] = _sums_ok(dist, groups, ctx.rank)
    return out


# ---- 2, 3. a rank killed mid-reload; a restarted rank meets the survivors -------------------

VICTIM = 1
REPLACEMENT = 3  # the fourth process of the run: the victim's restart


def _die_inside_reload(mode: str) -> None:
    """Arm this rank to die inside its next reload: creating its second group (wrapper), or in
    its first backend resume (suspend, auto)."""
    if mode == "wrapper":
        from tests.support import run_events

        run_events.die_at("creation")
        return
    from reloadpg_autopatch.tools import cpu_nccl as s

    s.SuspendableGloo.resume = lambda self, *a, **k: os._exit(0)


def _kill_and_restart(
    ctx: Rank, mode: str, when: str, port: int, world_s: float = KILL_WORLD_S
) -> dict[str, Any]:
    """Ranks 0-2 cycle; rank 1 dies in a reload; the survivors time their error, end the world
    and start a new one with process 3 (the restarted rank 1), which then cycles three times."""
    import torch.distributed as dist

    ctx = _own(ctx, port)
    client = dist.TCPStore(ctx.host, ctx.port, 4, is_master=False, timeout=timedelta(seconds=60))
    out: dict[str, Any] = {}
    if ctx.rank != REPLACEMENT:
        dist, rpg, groups = _start(ctx, mode, world_size=3, prefix="first/", timeout=world_s)
        rpg.destroy_process_groups()
        rpg.reload_process_groups()  # one good cycle first
        dist.barrier()
        rpg.destroy_process_groups()
        if ctx.rank == VICTIM:
            if when == "before reload":
                os._exit(0)
            _die_inside_reload(mode)
        started = time.monotonic()
        try:
            rpg.reload_process_groups()
            out["error"] = None
        except BaseException as error:
            out["error"] = _error(error)
        out["seconds_to_error"] = time.monotonic() - started
        try:
            dist.destroy_process_group()  # the program ends the broken world
            out["end_world"] = "ok"
        except Exception as error:
            out["end_world"] = _error(error)
        del groups
        client.add("restart/survivors", 1)
    else:  # the restarted rank, a fresh process: it joins once the survivors gave up
        while client.add("restart/survivors", 0) < 2:
            time.sleep(0.05)
    rank = VICTIM if ctx.rank == REPLACEMENT else ctx.rank
    out["pid"] = os.getpid()
    try:
        started = time.monotonic()
        dist, rpg, groups = _start(
            dataclasses.replace(ctx, rank=rank), mode, world_size=3, prefix="second/"
        )
        sums = []
        for _ in range(3):
            rpg.destroy_process_groups()
            rpg.reload_process_groups()
            sums.append(_sums_ok(dist, groups, rank))
        out["restart"] = {"sums_ok": sums, "seconds": time.monotonic() - started}
        dist.destroy_process_group()
    except BaseException as error:
        out["restart"] = {"error": _error(error), "seconds": time.monotonic() - started}
    return out


# ---- 4. a compiled step ---------------------------------------------------------------------


def _compiled(ctx: Rank, mode: str | None, cycles: int) -> dict[str, Any]:
    """A small model's step with an all_reduce, under torch.compile, one cycle between steps.
    ``mode`` None: the gate off, no cycles (the control)."""
    import multiprocessing

    import torch
    from torch._dynamo.utils import counters

    multiprocessing.current_process().daemon = False
    if mode is None:
        import torch.distributed as dist

        ctx.init()
        group, rpg = dist.new_group([0, 1]), None
    else:
        dist, rpg, groups = _start(ctx, mode)
        group = next(iter(groups.values()))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

    def step(x: torch.Tensor) -> torch.Tensor:
        y = model(x)
        dist.all_reduce(y, group=group)
        dist.all_reduce(y)  # and on WORLD (swapped and restored each cycle in wrapper mode)
        return y

    compiled = torch.compile(step, backend="aot_eager")
    values, seconds = [], []
    with torch.no_grad():
        for i in range(cycles + 1):
            if rpg is not None and i:
                rpg.destroy_process_groups()
                rpg.reload_process_groups()
            x = torch.full((2, 8), float(i + ctx.rank)) / 10
            started = time.monotonic()
            values.append(compiled(x).tolist())
            seconds.append(time.monotonic() - started)
    return {
        "values": values,
        "frames": counters["frames"]["ok"],
        "recompiles": sum(counters["recompiles"].values()),
        "graph_breaks": sum(counters["graph_break"].values()),
        "first_s": seconds[0],
        "later_s_median": sorted(seconds[1:])[len(seconds[1:]) // 2],
    }


# ---- 7, 8. process-global state and store keys over a long run ------------------------------


def _globals() -> dict[str, Any]:
    """What a program owns process-wide, as comparable values."""
    import faulthandler
    import signal
    import threading

    handlers = {}
    for sig in signal.valid_signals():
        try:
            handlers[getattr(sig, "name", str(int(sig)))] = repr(signal.getsignal(sig))
        except (ValueError, OSError):
            continue
    with open("/proc/self/status") as status:
        rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
    return {
        "handlers": handlers,
        "sys.excepthook": repr(sys.excepthook),
        "threading.excepthook": repr(threading.excepthook),
        "sys.unraisablehook": repr(sys.unraisablehook),
        "faulthandler enabled": faulthandler.is_enabled(),
        "environ": dict(os.environ),
        "python threads": threading.active_count(),
        "os threads": len(os.listdir("/proc/self/task")),
        "fds": len(os.listdir("/proc/self/fd")),
        "rss_kb": rss,
    }


def _diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    env_b, env_a = before["environ"], after["environ"]
    return {
        "signals changed": sorted(
            k for k in before["handlers"] if before["handlers"][k] != after["handlers"].get(k)
        ),
        "hooks changed": [
            k
            for k in ("sys.excepthook", "threading.excepthook", "sys.unraisablehook")
            if before[k] != after[k]
        ],
        "faulthandler enabled": [before["faulthandler enabled"], after["faulthandler enabled"]],
        "environ added": sorted(set(env_a) - set(env_b)),
        "environ removed": sorted(set(env_b) - set(env_a)),
        "environ changed": sorted(k for k in env_b if k in env_a and env_b[k] != env_a[k]),
        **{k: [before[k], after[k]] for k in ("python threads", "os threads", "fds", "rss_kb")},
    }


def _mark(client: Any) -> dict[str, Any]:
    """The store's keys and this process's resources, with every rank at the same point."""
    import torch.distributed as dist

    dist.barrier()  # every rank is done with the cycle before
    figures = {"keys": client.num_keys(), **_globals()}
    dist.barrier()  # and no rank starts the next before every rank has counted
    return {k: figures[k] for k in ("keys", "os threads", "python threads", "fds", "rss_kb")}


def _long_run(ctx: Rank, mode: str, cycles: int, port: int, timer_s: float = 0.0) -> dict[str, Any]:
    """``cycles`` cycles, an all_reduce on every group after each; the globals before the
    first cycle, after the first and at the end; the store's keys and resources at marks.
    ``timer_s``: the program arms its own repeating faulthandler timer first (a hang
    detector), which must still fire at the end; this rank then records its progress in the
    store every 10 cycles (keys that are not counted then), for a run that crashes."""
    import faulthandler
    import tempfile

    ctx = _own(ctx, port)
    dump = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed below
    if timer_s:
        faulthandler.dump_traceback_later(timer_s, repeat=True, file=dump)  # the program's own
    dist, rpg, groups = _start(ctx, mode)
    client = dist.TCPStore(ctx.host, ctx.port, ctx.world_size, is_master=False)
    marks = {0: _mark(client)}
    before = _globals()
    seconds, wrong = [], 0
    first = None
    for cycle in range(1, cycles + 1):
        started = time.perf_counter()
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        seconds.append(time.perf_counter() - started)
        wrong += not _sums_ok(dist, groups, ctx.rank)
        if timer_s and cycle % 10 == 0:
            client.set(f"progress/{ctx.rank}", str(cycle))
        if cycle == 1:
            first = _globals()
        if cycle in (1, KEY_CYCLES, cycles // 2, cycles):
            marks[cycle] = _mark(client)
    after = _globals()
    dump.seek(0, os.SEEK_END)
    mark = dump.tell()
    time.sleep(timer_s + 0.5 if timer_s else 0)
    dump.seek(0, os.SEEK_END)
    timer_fires = dump.tell() > mark if timer_s else None
    faulthandler.cancel_dump_traceback_later()
    dump.close()
    head, tail = sorted(seconds[:KEY_CYCLES]), sorted(seconds[-KEY_CYCLES:])
    return {
        "cycles": cycles,
        "wrong_sums": wrong,
        "marks": marks,
        "vs_before": _diff(before, after),
        "vs_after_first_cycle": _diff(first, after) if first else None,
        "program_timer_still_fires": timer_fires,
        "cycle_ms_first_50_median": 1e3 * head[len(head) // 2],
        "cycle_ms_last_50_median": 1e3 * tail[len(tail) // 2],
    }


def _torch_recreates(ctx: Rank, cycles: int, port: int) -> dict[str, Any]:
    """The control for the keys: gate off, torch destroys and re-creates the same two groups
    (``destroy_process_group(g)`` then ``new_group``) each cycle; WORLD stays."""
    import multiprocessing

    import torch.distributed as dist

    multiprocessing.current_process().daemon = False
    ctx = _own(ctx, port)
    ctx.init()
    client = dist.TCPStore(ctx.host, ctx.port, ctx.world_size, is_master=False)
    ranks = list(range(ctx.world_size))
    groups = {"pair": dist.new_group(ranks[:2]), "all": dist.new_group(ranks)}
    marks = {0: _mark(client)}
    for cycle in range(1, cycles + 1):
        for name in list(groups):
            dist.destroy_process_group(groups[name])
            groups[name] = dist.new_group(ranks if name == "all" else ranks[:2])
        _sums_ok(dist, groups, ctx.rank)
        if cycle in (1, cycles):
            marks[cycle] = _mark(client)
    return {"marks": marks}


# ---- the parent -----------------------------------------------------------------------------


class _Store:
    """A TCPStore server this process owns: the oracle for keys."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.server = dist.TCPStore(HOST, 0, 1, is_master=True, wait_for_workers=False)
        self.port = self.server.port


def fork_part(modes: tuple[str, ...]) -> dict[str, Any]:
    out = {}
    for mode in modes:
        store = _Store()
        fn = functools.partial(_fork_asleep, mode=mode, port=store.port)
        out[mode] = run_ranks(fn, 2, timeout=150, env=_env(mode))
    return out


def kill_part(modes: tuple[str, ...]) -> dict[str, Any]:
    out = {}
    for mode in modes:
        for when in ("before reload", "inside reload"):
            store = _Store()
            fn = functools.partial(_kill_and_restart, mode=mode, when=when, port=store.port)
            env = _env(mode, SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT=KILL_WATCHDOG_S)
            try:
                reports = run_ranks(fn, 4, timeout=120, env=env, may_die=frozenset({VICTIM}))
            except AssertionError as error:  # a survivor died or hung: that is the figure
                reports = [f"run failed: {str(error)[:1500]}"]
            out[f"{mode}, {when}"] = reports
    return out


def compiled_part(modes: tuple[str, ...], cycles: int = COMPILED_CYCLES) -> dict[str, Any]:
    control = run_ranks(
        functools.partial(_compiled, mode=None, cycles=cycles),
        2,
        timeout=240,
        env={"SLIME_RELOADABLE_PG": None},
    )
    out: dict[str, Any] = {"control (gate off, no cycles)": control}
    for mode in modes:
        reports = run_ranks(
            functools.partial(_compiled, mode=mode, cycles=cycles), 2, timeout=240, env=_env(mode)
        )
        for rank, report in enumerate(reports):
            report["equal_to_control"] = report["values"] == control[rank]["values"]
            del report["values"]
        out[mode] = reports
    for report in control:
        del report["values"]
    return out


def threads_part() -> dict[str, Any]:
    from tests.support import run_events

    out = {}
    for label, env, policy in (
        ("gate off", {"SLIME_RELOADABLE_PG": None}, None),
        ("gate on, auto policy", GATE, None),
        ("gate on, all policy", GATE, "all"),
    ):
        fn = functools.partial(run_events.threaded_world, policy=policy)
        (out[label],) = run_ranks(fn, 1, timeout=90, env=env)
    return out


def scale_part(reps: int = 3) -> dict[str, Any]:
    from benchmarks import scale

    (point,) = scale._threads_child((4096,), reps, "rendezvous")
    point.pop("samples", None)
    return point


def long_part(modes: tuple[str, ...], cycles: int) -> dict[str, Any]:
    out = {}
    for mode in modes:
        store = _Store()
        fn = functools.partial(_long_run, mode=mode, cycles=cycles, port=store.port)
        reports = run_ranks(fn, 2, timeout=900, env=_env(mode))
        out[mode] = {"ranks": reports, "server_num_keys_at_end": store.server.num_keys()}
    store = _Store()
    fn = functools.partial(_torch_recreates, cycles=KEY_CYCLES, port=store.port)
    reports = run_ranks(fn, 2, timeout=300, env={"SLIME_RELOADABLE_PG": None})
    out["control: torch re-creating two groups, gate off"] = {
        "ranks": reports,
        "server_num_keys_at_end": store.server.num_keys(),
    }
    return out


def timer_part(modes: tuple[str, ...], cycles: int, timer_s: float = TIMER_S) -> dict[str, Any]:
    """The long run again, the program's repeating faulthandler timer armed: a rank that
    crashes is the figure (its exit status and the last cycle it recorded)."""
    out: dict[str, Any] = {}
    for mode in modes:
        store = _Store()
        fn = functools.partial(
            _long_run, mode=mode, cycles=cycles, port=store.port, timer_s=timer_s
        )
        started = time.monotonic()
        try:
            reports = run_ranks(fn, 2, timeout=900, env=_env(mode))
            out[mode] = {
                "survived": True,
                "timer_still_fires": [r["program_timer_still_fires"] for r in reports],
                "cycles": cycles,
            }
        except AssertionError as error:  # RankFailure: a rank died
            reached = []
            for rank in range(2):
                try:
                    reached.append(int(store.server.get(f"progress/{rank}")))
                except Exception:
                    reached.append(0)
            out[mode] = {"survived": False, "error": str(error)[:300], "reached_cycle": reached}
        out[mode]["seconds"] = time.monotonic() - started
    return out


# ---- the table ------------------------------------------------------------------------------


def _fork_rows(raw: dict[str, Any]) -> list[Row]:
    rows = []
    for mode, ranks in raw.items():
        works = all(
            r["forks"]["loader"] == 28.0
            and r["forks"]["pool"] == [0, 1, 4, 9, 16, 25]
            and r["forks"]["bare"] == 0
            and [w["value"] for w in r["workers"]] == [6.0, 7.0, 10.0, 15.0]
            for r in ranks
        )
        held = sorted({w["reloadable"] for r in ranks for w in r["workers"]})
        cycle = [r["worker_cycle"] for r in ranks]
        keys = [r["store_keys_before_after_children"] for r in ranks]
        untouched = all(
            isinstance(c, dict) and c["outcome"] == "returned" and c["backend_calls"] == 0
            for c in cycle
        ) and all(a == b for a, b in keys)
        after = all(r["sums_ok_after_reload"] for r in ranks)
        worker_ms = max(c["seconds"] for c in cycle if isinstance(c, dict)) * 1e3
        rows.append(
            Row(
                "1 fork",
                f"{mode}: DataLoader (2 workers), Pool(2), bare fork, started while asleep",
                f"work: {works}; workers hold {held} groups; a worker's destroy+reload returns "
                f"in {worker_ms:.2f} ms, 0 backend calls; store keys {keys[0][0]} -> "
                f"{keys[0][1]}; parent's reload after: sums right {after}",
                "work, touch nothing",
                works and untouched and after and held == [0],
            )
        )
    return rows


def _kill_rows(raw: dict[str, Any]) -> list[Row]:
    rows = []
    for label, ranks in raw.items():
        if isinstance(ranks[0], str):
            rows.append(Row("2 kill", label, ranks[0][:200], "-", False))
            continue
        survivors = [(i, r) for i, r in enumerate(ranks) if r and i not in (VICTIM, REPLACEMENT)]
        errors = {r["error"]["type"] if r["error"] else "no error" for _, r in survivors}
        seconds = [r["seconds_to_error"] for _, r in survivors]
        rows.append(
            Row(
                "2 kill",
                f"{label}: survivors (ranks 0, 2) get",
                f"{'/'.join(sorted(errors))} after {min(seconds):.2f} to {max(seconds):.2f} s "
                f"(WORLD's timeout {KILL_WORLD_S:.0f} s)",
                f"an error within {KILL_WORLD_S:.0f} s + 10 s",
                "no error" not in errors and max(seconds) < KILL_WORLD_S + 10,
            )
        )
        restarts = [r["restart"] for r in ranks if r]
        ok = all("sums_ok" in x and all(x["sums_ok"]) for x in restarts)
        slowest = max(x["seconds"] for x in restarts)
        rows.append(
            Row(
                "3 restart",
                f"{label}: survivors end the world; a fresh process takes rank 1 of a new one",
                f"new world + 3 cycles, every sum right: {ok}; {slowest:.2f} s (slowest rank)",
                "works",
                ok,
            )
        )
    return rows


def _compiled_rows(raw: dict[str, Any]) -> list[Row]:
    control = raw["control (gate off, no cycles)"]
    rows = []
    for mode, ranks in raw.items():
        if mode.startswith("control"):
            continue
        equal = all(r["equal_to_control"] for r in ranks)
        recompiles = max(r["recompiles"] for r in ranks)
        breaks = max(r["graph_breaks"] for r in ranks)
        step = max(r["later_s_median"] for r in ranks) * 1e3
        rows.append(
            Row(
                "4 compiled",
                f"{mode}: Linear-ReLU-Linear + all_reduce (group, WORLD), aot_eager, "
                f"{COMPILED_CYCLES} cycles",
                f"equal to the gate-off control: {equal}; recompiles {recompiles}, graph breaks "
                f"{breaks}; step {step:.1f} ms (control "
                f"{max(r['later_s_median'] for r in control) * 1e3:.1f} ms)",
                "equal, no recompile",
                equal and recompiles == 0,
            )
        )
    return rows


def _thread_rows(raw: dict[str, Any]) -> list[Row]:
    off = raw["gate off"]["results"]
    return [
        Row(
            "5 threads",
            f"4 thread ranks (torch's threaded pg), {label}",
            f"results as with the gate off: {v['results'] == off}; hung: {v['hung']}",
            "as gate off",
            v["results"] == off and not v["hung"],
        )
        for label, v in raw.items()
        if label != "gate off"
    ]


def _scale_rows(raw: dict[str, Any]) -> list[Row]:
    s = raw["seconds"]
    return [
        Row(
            "6 scale",
            f"{raw['world_size']} thread ranks: destroy + reload agreements (benchmarks.scale)",
            f"{s['median']:.2f} s [{s['p25']:.2f}-{s['p75']:.2f}]; per rank "
            f"{raw['ops_per_rank']['median']:.0f} store ops (max {raw['ops_per_rank']['max']:.0f})"
            f", {raw['bytes_per_rank']['median'] / 1e3:.1f} kB (the merger "
            f"{raw['bytes_per_rank']['max'] / 1e3:.0f} kB)",
            "flat per rank",
            None,
        )
    ]


def _long_rows(raw: dict[str, Any]) -> list[Row]:
    rows = []
    for mode, v in raw.items():
        r0 = v["ranks"][0]
        marks = {int(k): m for k, m in r0["marks"].items()}
        last = max(marks)
        per_cycle = (marks[last]["keys"] - marks[1]["keys"]) / max(last - 1, 1)
        keys = " -> ".join(f"{marks[c]['keys']} ({c})" for c in sorted(marks))
        if mode.startswith("control"):
            rows.append(Row("8 keys", mode, f"{keys}: {per_cycle:.1f} per cycle", "-", None))
            continue
        at_50 = marks.get(KEY_CYCLES, marks[last])["keys"]
        rows.append(
            Row(
                "8 keys",
                f"{mode}: store.num_keys() at cycle 0, 1, ...",
                f"{keys}: {per_cycle:.1f} per cycle; {at_50} after {KEY_CYCLES}",
                "flat",
                per_cycle == 0,
            )
        )
        diffs = [r["vs_before"] for r in v["ranks"]]
        same = all(
            not d["signals changed"]
            and not d["hooks changed"]
            and d["faulthandler enabled"][0] == d["faulthandler enabled"][1]
            and not (d["environ added"] or d["environ removed"] or d["environ changed"])
            for d in diffs
        )
        d = diffs[0]
        rows.append(
            Row(
                "7 globals",
                f"{mode}: after {r0['cycles']} cycles vs before the first (rank 0 of 2)",
                f"signals, hooks, faulthandler, environ unchanged: {same}; os threads "
                f"{d['os threads'][0]} -> {d['os threads'][1]}, fds {d['fds'][0]} -> "
                f"{d['fds'][1]}, RSS {marks[0]['rss_kb'] / 1e3:.1f} -> "
                f"{marks[1]['rss_kb'] / 1e3:.1f} (1) -> {marks[last]['rss_kb'] / 1e3:.1f} MB; "
                f"wrong sums {sum(r['wrong_sums'] for r in v['ranks'])}; cycle "
                f"{r0['cycle_ms_first_50_median']:.0f} ms first 50, "
                f"{r0['cycle_ms_last_50_median']:.0f} ms last 50",
                "unchanged",
                same and d["os threads"][0] == d["os threads"][1] and d["fds"][0] == d["fds"][1],
            )
        )
    return rows


def _timer_rows(raw: dict[str, Any]) -> list[Row]:
    rows = []
    for mode, v in raw.items():
        if v["survived"]:
            value = (
                f"{v['cycles']} cycles, no crash; the timer still fires: {v['timer_still_fires']}"
            )
        else:
            reached = max(v["reached_cycle"])
            value = f"a rank crashed ({v['error'][:60]}) within 10 cycles after {reached}"
        rows.append(
            Row(
                "7 timer",
                f"{mode}: the program's dump_traceback_later({TIMER_S:g}, repeat=True)",
                value,
                "survives, still fires",
                v["survived"] and all(v["timer_still_fires"]),
            )
        )
    return rows


def rows_of(raw: dict[str, Any]) -> list[Row]:
    builders = {
        "fork": _fork_rows,
        "kill": _kill_rows,
        "compiled": _compiled_rows,
        "threads": _thread_rows,
        "scale": _scale_rows,
        "long": _long_rows,
        "timer": _timer_rows,
    }
    return [row for name, build in builders.items() if name in raw for row in build(raw[name])]


PARTS = ("fork", "kill", "compiled", "threads", "scale", "long", "timer")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.whole_run", description=__doc__)
    parser.add_argument("--cycles", type=int, default=200, help="cycles of the long runs (7, 8)")
    parser.add_argument("--out", type=Path, help="where to write the JSON (default: results/)")
    parser.add_argument("--parts", default=",".join(PARTS), help="a subset, comma-separated")
    parser.add_argument("--no-save", action="store_true", help="print only, write no results")
    parser.add_argument("--json", action="store_true", help="print the raw figures too")
    args = parser.parse_args(argv)
    import torch

    parts = args.parts.split(",")
    raw: dict[str, Any] = {}
    timings: dict[str, float] = {}
    for name, call in (
        ("fork", lambda: fork_part(MODES)),
        ("kill", lambda: kill_part(MODES)),
        ("compiled", lambda: compiled_part(MODES)),
        ("threads", threads_part),
        ("scale", scale_part),
        ("long", lambda: long_part(MODES, args.cycles)),
        ("timer", lambda: timer_part(MODES, args.cycles)),
    ):
        if name not in parts:
            continue
        started = time.monotonic()
        raw[name] = call()
        timings[name] = time.monotonic() - started
        print(f"{name}: {timings[name]:.0f} s", file=sys.stderr)
    rows = rows_of(raw)
    if args.json:
        print(json.dumps(raw, indent=1, default=repr))
    print(table(rows))
    missed = [r for r in rows if r.ok is False]
    print(f"\n{len(rows)} rows, {len(missed)} missed; {sum(timings.values()):.0f} s in all")
    if args.no_save:
        return 0
    today = datetime.date.today().isoformat()
    meta = stats.run_meta(cycles=args.cycles, seconds=timings)
    table_rows = [r.__dict__ | {"verdict": r.verdict} for r in rows]
    target = args.out or RESULTS / f"{today}-{torch.__version__}-whole-run.json"
    payload = {"meta": meta, "table": table_rows, "raw": raw}
    target.write_text(json.dumps(payload, indent=2, default=repr) + "\n")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
