"""Real-job breakages (issue 24): restarted ranks, registration, early calls, torch's globals.

Each test is one failure a training job met. Every rank is activated by the gate alone, on real
gloo (and, for the restarted actor, real Ray). WORLD is registered with
``accelerator_backends=("gloo",)`` so that it is swapped on CPU as an NCCL WORLD is on a GPU.
The oracles sit outside the package: torch's own results (collectives, ``is_initialized()``,
the default groups torch builds, counted at ``_new_process_group_helper``), object identity,
the wall clock against WORLD's timeout, the text an uncaught exception prints, the hooks' own
call counters and the exceptions' types and messages. One fault is injected (a temporary WORLD
that cannot be created), because nothing real fails there on CPU; the test says so.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest

from tests.support import PROGRAMS, world_ranks
from tests.support.ranks import GATE, Rank, run_ranks, total
from tests.support.venv import ROOT, clean_env

pytestmark = pytest.mark.timeout(300)

# ---- 1. every rank of a world derives the same keys, whatever its process did before --------


def _veteran_meets_newcomer(ctx: Rank, registered: bool) -> dict:
    """Rank 0 ends a world of its own first (its process has then ended one world); rank 1 is a
    fresh process. Then both start a world together and cycle it."""
    import time

    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    rpg.set_wrap_policy("all")
    if ctx.rank == 0:
        dist.init_process_group(
            "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=world_ranks.SHORT
        )
        if registered:
            rpg.register_default_process_group(
                world_ranks.SHORT, accelerator_backends=world_ranks.SWAP
            )
        own = dist.new_group([0])
        for _ in range(2):
            rpg.destroy_process_groups()
            rpg.reload_process_groups()
        total(own, 1.0)
        dist.destroy_process_group()  # the program ends that world
    ctx.reinit("second-world/", world_ranks.SHORT)
    if registered:
        rpg.register_default_process_group(world_ranks.SHORT, accelerator_backends=world_ranks.SWAP)
    pair = dist.new_group([0, 1])
    started = time.monotonic()
    sums: list[list[float]] = []
    error = None
    try:
        for _ in range(3):
            rpg.destroy_process_groups()
            rpg.reload_process_groups()
            sums.append([total(None, ctx.rank + 1), total(pair, ctx.rank + 1)])
    except RuntimeError as exc:
        error = world_ranks.error_text(exc)
    return {"sums": sums, "error": error, "seconds": time.monotonic() - started}


@pytest.mark.parametrize("registered", [True, False], ids=["WORLD-registered", "groups-only"])
def test_a_process_that_ended_a_world_meets_a_fresh_process(registered: bool) -> None:
    """A replacement rank (fresh process) and a survivor (which ended the earlier world) cycle
    a new world together: three cycles well within WORLD's 10 s timeout, every sum right, no
    error (today each side waits under keys of its own and blames the peer that arrived)."""
    reports = run_ranks(
        functools.partial(_veteran_meets_newcomer, registered=registered),
        2,
        timeout=120,
        env=GATE,
    )
    for rank, report in enumerate(reports):
        assert report["error"] is None, (rank, report["error"])
        assert report["sums"] == [[3.0, 3.0]] * 3, (rank, report)
        assert report["seconds"] < world_ranks.SHORT.total_seconds() / 2, (rank, report)


@pytest.mark.timeout(420)
@pytest.mark.usefixtures("one_ray_cluster_at_a_time")
def test_a_ray_actor_restarted_by_ray_meets_the_survivors(tmp_path) -> None:
    """Ray restarts a killed actor (``max_restarts=1``); the survivor ends its world; all
    ranks start a new world and cycle it: within WORLD's timeout, every sum right, no error."""
    proc = subprocess.run(
        [sys.executable, str(PROGRAMS / "ray_restart.py"), str(world_ranks.SHORT.total_seconds())],
        env=clean_env(RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(ROOT)),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for info in report["info"]:
        assert info["gate"] == "1", info
        assert info["patched"], info  # runtime_env's gate alone patched the actor
        assert info["module"].startswith(str(ROOT)), info  # the tree under test
    restarted = report["restarted"]
    assert restarted is not None, report
    assert restarted["pid"] != report["info"][1]["pid"], report  # Ray really restarted it
    assert restarted["patched"], restarted
    for cycle in report["first_cycles"]:
        assert [r["error"] for r in cycle] == [None, None], cycle
    assert report["ended"] == [False], report  # torch: the survivor's world is over
    assert [r["world"] for r in report["second_init"]] == [[3.0, 3.0]] * 2, report
    cycles = report["second_cycles"]
    errors = [r["error"] for cycle in cycles for r in cycle if r["error"]]
    assert errors == [], errors
    assert len(cycles) == 3, cycles
    for cycle in cycles:
        for result in cycle:
            assert result["sums"] == [3.0, 3.0], cycle
            assert result["seconds"] < world_ranks.SHORT.total_seconds() / 2, cycle


def _creation_keys_of_two_worlds(ctx: Rank, swapped: bool) -> dict:
    """Two worlds, one after the other, on the same store and with no prefix of their own."""
    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from tests.support import stores

    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    rpg.set_wrap_policy("all")
    keys: dict[str, list[str]] = {}
    for world in ("first", "second"):
        store = dist.TCPStore(
            ctx.host, ctx.port, ctx.world_size, is_master=False, timeout=world_ranks.TIMEOUT
        )
        if world == "second":
            # torch's own WORLD rendezvous would read the first world's addresses (its keys
            # carry no world either): clear torch's keys, keep every key of the package's.
            stores.forget_torchs_keys(store, ctx.rank, ctx.world_size)
        dist.init_process_group(
            "gloo",
            store=store,
            rank=ctx.rank,
            world_size=ctx.world_size,
            timeout=world_ranks.TIMEOUT,
        )
        # Swapped, the groups are created under the restored WORLD's keys; not, under the
        # store WORLD was made with.
        if swapped:
            rpg.register_default_process_group(
                world_ranks.TIMEOUT, accelerator_backends=world_ranks.SWAP
            )
        pair = dist.new_group([0, 1])
        for _ in range(2):
            rpg.destroy_process_groups()
            rpg.reload_process_groups()
        assert total(pair, ctx.rank + 1) == 3.0
        dist.barrier()
        # What torch wrote in the store while creating the groups of every reload, and the
        # WORLD each reload restored: the peers' addresses, under the package's prefixes.
        keys[world] = sorted(k for k in store.list_keys() if "/groups/" in k or "/world/" in k)
        dist.destroy_process_group()
    return keys


@pytest.mark.parametrize("swapped", [True, False], ids=["WORLD-swapped", "groups-only"])
def test_a_world_on_a_store_an_earlier_world_used_never_reads_its_creation_keys(
    swapped: bool,
) -> None:
    """torch's own rendezvous of the groups a reload creates (and of the WORLD it restores)
    reads every peer's address under its keys: a second world on the same store, at the same
    cycles, must write them under keys of its own, or a late peer reads a dead peer's address.
    The oracle is the real store's keys: the second world adds as many as the first wrote."""
    body = functools.partial(_creation_keys_of_two_worlds, swapped=swapped)
    for rank, report in enumerate(run_ranks(body, 2, env=GATE)):
        first, second = set(report["first"]), set(report["second"])
        assert first, (rank, "no creation key in the store: the oracle sees nothing")
        assert first <= second, (rank, "the first world's keys went away")
        assert len(second - first) == len(first), (rank, sorted(first)[:2], sorted(second)[:4])


# ---- 2. registering WORLD twice ----------------------------------------------------------------


def _identity_cycles(dist: Any, saved: Any, rank: int, cycles: int) -> list[dict]:
    import torch
    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch as rpg

    worlds = world_ranks.DefaultGroups()
    out = []
    for _ in range(cycles):
        built = worlds.built
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        backend = saved._get_backend(torch.device("cpu"))
        out.append(
            {
                "same": [
                    dist.group.WORLD is saved,
                    dist.GroupMember.WORLD is saved,
                    c10d._get_default_group() is saved,
                ],
                "sums": [total(None, rank + 1), total(saved, rank + 1)],
                "worlds_built": worlds.built - built,
                "timeout_s": backend.options._timeout.total_seconds(),
            }
        )
    return out


def _register_twice(ctx: Rank) -> dict:
    import reloadpg_autopatch as rpg

    dist = world_ranks.begin(ctx)
    rpg.register_default_process_group(world_ranks.TIMEOUT, accelerator_backends=world_ranks.SWAP)
    saved = dist.group.WORLD
    out: dict[str, Any] = {}
    try:
        rpg.register_default_process_group(
            world_ranks.TIMEOUT, accelerator_backends=world_ranks.SWAP
        )
        out["same_args"] = "no error"
    except Exception as error:
        out["same_args"] = world_ranks.error_text(error)
    out["after_same"] = _identity_cycles(dist, saved, ctx.rank, 3)
    try:
        rpg.register_default_process_group(
            2 * world_ranks.TIMEOUT, accelerator_backends=world_ranks.SWAP
        )
        out["other_timeout"] = {"error": None}
    except Exception as error:
        out["other_timeout"] = {
            "error": world_ranks.error_text(error),
            "runtime_error": isinstance(error, RuntimeError),
            "message": str(error),
        }
    try:  # the backends torch registers for accelerators (None), where gloo was asked
        rpg.register_default_process_group(world_ranks.TIMEOUT)
        out["other_backends"] = {"error": None}
    except Exception as error:
        out["other_backends"] = {
            "error": world_ranks.error_text(error),
            "runtime_error": isinstance(error, RuntimeError),
            "message": str(error),
        }
    out["after_other"] = _identity_cycles(dist, saved, ctx.rank, 3)
    return out


def test_registering_world_twice_keeps_the_first_registration() -> None:
    """The same arguments again: nothing happens. Other arguments (a timeout, the accelerator
    backends): a RuntimeError naming the parameter. Either way WORLD stays one object, swapped
    every cycle, with the first registration's timeout (torch's own backend options say
    which)."""
    for report in run_ranks(_register_twice, 2, timeout=150, env=GATE):
        assert report["same_args"] == "no error", report["same_args"]
        other = report["other_timeout"]
        assert other["error"] is not None, "registering again with another timeout raised nothing"
        assert other["runtime_error"], other
        assert "timeout" in other["message"], other
        backends = report["other_backends"]
        assert backends["error"] is not None, "registering again with other backends passed"
        assert backends["runtime_error"], backends
        assert "accelerator_backends" in backends["message"], backends
        for label in ("after_same", "after_other"):
            for cycle in report[label]:
                assert cycle["same"] == [True, True, True], (label, cycle)
                assert cycle["sums"] == [3.0, 3.0], (label, cycle)
                assert cycle["worlds_built"] == 2, (label, cycle)  # temporary and restored
                assert cycle["timeout_s"] == world_ranks.TIMEOUT.total_seconds(), (label, cycle)


# ---- 3. registration arguments are checked at registration -----------------------------------

BAD_REGISTRATIONS = {
    "negative-timeout": ({"timeout": timedelta(seconds=-1)}, "timeout"),
    "zero-timeout": ({"timeout": timedelta(0)}, "timeout"),
    "unknown-temporary-backend": ({"temporary_backend": "nosuchbackend"}, "temporary_backend"),
}
#: What an error for a bad timeout says is accepted.
ACCEPTED_TIMEOUT = re.compile(r"positive|greater than (0|zero)|> ?0|more than (0|zero)", re.I)


def _bad_registration(ctx: Rank, case: str) -> dict:
    import time

    import reloadpg_autopatch as rpg

    dist = world_ranks.begin(ctx)
    kwargs, _ = BAD_REGISTRATIONS[case]
    out: dict[str, Any] = {}
    started = time.monotonic()
    try:
        rpg.register_default_process_group(**{"accelerator_backends": world_ranks.SWAP, **kwargs})
        out["bad"] = {"error": None}
    except Exception as error:
        out["bad"] = {
            "error": world_ranks.error_text(error),
            "value_error": isinstance(error, ValueError),
            "message": str(error),
        }
    out["seconds"] = time.monotonic() - started
    # Nothing registered: torch's own default group is still WORLD, no stand-in in its place.
    out["world_is_torchs"] = type(dist.group.WORLD) is dist.ProcessGroup
    try:
        rpg.register_default_process_group(
            world_ranks.TIMEOUT, accelerator_backends=world_ranks.SWAP
        )
        out["good"] = "no error"
        out["cycles"] = _identity_cycles(dist, dist.group.WORLD, ctx.rank, 2)
    except Exception as error:
        out["good"] = world_ranks.error_text(error)
    return out


@pytest.mark.parametrize("case", list(BAD_REGISTRATIONS))
def test_bad_registration_arguments_fail_at_registration(case: str) -> None:
    """A negative or zero WORLD timeout, or an unknown temporary backend: ValueError at once,
    naming the parameter and what is accepted; nothing is registered, and a correct
    registration afterwards swaps WORLD every cycle."""
    _, parameter = BAD_REGISTRATIONS[case]
    (report,) = run_ranks(functools.partial(_bad_registration, case=case), 1, timeout=90, env=GATE)
    bad = report["bad"]
    assert bad["error"] is not None, f"{case}: register_default_process_group accepted it"
    assert bad["value_error"], bad
    assert report["seconds"] < 1.0, report
    message = bad["message"]
    assert parameter in message, bad
    if parameter == "timeout":
        assert ACCEPTED_TIMEOUT.search(message), bad
    else:
        assert "nosuchbackend" in message, bad
        assert "gloo" in message, bad  # an accepted backend is named
    assert report["world_is_torchs"], report
    assert report["good"] == "no error", report
    for cycle in report["cycles"]:
        assert cycle["same"] == [True, True, True], cycle
        assert cycle["sums"] == [1.0, 1.0], cycle
        assert cycle["worlds_built"] == 2, cycle


#: Words that say, in the error of a failed swap, in what state WORLD is now.
STATE_GONE = re.compile(r"not initiali[sz]ed|destroyed|is gone|no WORLD|torn down|no longer", re.I)
STATE_KEPT = re.compile(r"unchanged|as it was|intact|still (usable|works|live|in place)", re.I)


class _FailingTemporaryWorld:
    """FAULT INJECTION: the temporary WORLD of the next destroy cannot be created.

    Nothing real makes that creation fail on CPU, so the first default group torch is asked to
    build after ``arm()`` (in a destroy, that is the temporary WORLD) raises instead. It sits at
    torch's ``_new_process_group_helper``, which ``init_process_group`` calls whichever
    reference to ``init_process_group`` the caller holds; ``fired`` says it did.
    """

    MESSAGE = "injected fault: the temporary WORLD cannot be created"

    def __init__(self) -> None:
        from torch.distributed import distributed_c10d as c10d

        self.armed = False
        self.fired = 0
        self.worlds_built = 0
        self._helper = c10d._new_process_group_helper
        c10d._new_process_group_helper = self._faulty

    def arm(self) -> None:
        self.armed = True

    def _faulty(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("group_desc") == "default_pg":
            if self.armed:
                self.armed = False
                self.fired += 1
                raise RuntimeError(self.MESSAGE)
            self.worlds_built += 1
        return self._helper(*args, **kwargs)


def _failed_swap(ctx: Rank) -> dict:
    import reloadpg_autopatch as rpg

    dist = world_ranks.begin(ctx)
    rpg.register_default_process_group(world_ranks.TIMEOUT, accelerator_backends=world_ranks.SWAP)
    pair = dist.new_group([0, 1])
    rpg.destroy_process_groups()
    rpg.reload_process_groups()  # one good cycle first
    fault = _FailingTemporaryWorld()
    fault.arm()
    out: dict[str, Any] = {}
    try:
        rpg.destroy_process_groups()
        out["error"] = None
    except Exception as error:
        out["error"] = world_ranks.error_text(error)
        out["message"] = str(error)
    out["fired"] = fault.fired
    out["initialized"] = dist.is_initialized()
    # Never half-gone: a group of the lost world says that world ended (not "reload first"),
    # and the package holds none of its groups any more, before anything else is called.
    try:
        dist.all_reduce(__import__("torch").ones(1), group=pair)
        out["old_group"] = "no error"
    except Exception as error:
        out["old_group"] = str(error)
    out["held_after"] = len(rpg.reloadable_groups())
    try:
        if out["initialized"]:
            # The world as it was: WORLD and the group work, and the cycle can go on.
            out["sums_after"] = [total(None, ctx.rank + 1), total(pair, ctx.rank + 1)]
        else:
            # WORLD is gone: a fresh world, registered, must cycle as any world does.
            ctx.reinit("after-failed-swap/", world_ranks.TIMEOUT)
            rpg.register_default_process_group(
                world_ranks.TIMEOUT, accelerator_backends=world_ranks.SWAP
            )
            pair = dist.new_group([0, 1])
        built = fault.worlds_built
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        out["worlds_built_in_cycle"] = fault.worlds_built - built
        out["sums_after_cycle"] = [total(None, ctx.rank + 1), total(pair, ctx.rank + 1)]
        out["recovery"] = "no error"
    except Exception as error:
        out["recovery"] = world_ranks.error_text(error)
    return out


def test_a_swap_that_fails_says_what_state_world_is_in_and_how_to_recover() -> None:
    """The temporary WORLD's creation fails (injected) on every rank during a destroy. The
    error says what state WORLD is in and how to recover; afterwards WORLD either works as it
    was, or ``is_initialized()`` is False and a fresh init, registration and cycle work (with
    WORLD swapped: torch builds the temporary and the restored WORLD)."""
    for rank, report in enumerate(run_ranks(_failed_swap, 2, timeout=150, env=GATE)):
        assert report["fired"] == 1, report  # the fault was injected where it was meant to be
        assert report["error"] is not None, report
        message = report["message"]
        if report["initialized"]:
            assert STATE_KEPT.search(message), (rank, message)
            assert "destroy_process_groups()" in message, (rank, message)  # call it again
            assert report["sums_after"] == [3.0, 3.0], (rank, report)
        else:
            assert STATE_GONE.search(message), (rank, message)
            assert "init_process_group" in message, (rank, message)  # the way back
            assert "WORLD that was destroyed" in report["old_group"], (rank, report)
            assert report["held_after"] == 0, (rank, report)
        assert report["recovery"] == "no error", (rank, report)
        assert report["worlds_built_in_cycle"] == 2, (rank, report)
        assert report["sums_after_cycle"] == [3.0, 3.0], (rank, report)


# ---- 4. destroy before init leaves no trace ----------------------------------------------------


def _destroy_before_init(ctx: Rank) -> dict:
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    calls = {"before_destroy": 0, "after_reload": 0}

    def before(groups: list[Any]) -> None:
        calls["before_destroy"] += 1

    def after(groups: list[Any]) -> None:
        calls["after_reload"] += 1

    rpg.add_reload_hook(before_destroy=before, after_reload=after, name="counter")
    out: dict[str, Any] = {"initialized_before": dist.is_initialized()}
    try:
        rpg.destroy_process_groups()
        out["early"] = "no error"
    except Exception as error:
        out["early"] = world_ranks.error_text(error)
    out["early_calls"] = dict(calls)
    early_report = rpg.last_cycle_report()
    out["early_report"] = None if early_report is None else early_report.to_dict()

    world_ranks.begin(ctx)
    rpg.register_default_process_group(world_ranks.TIMEOUT, accelerator_backends=world_ranks.SWAP)
    pair = dist.new_group([0, 1])
    worlds = world_ranks.DefaultGroups()
    cycles = []
    for _ in range(3):
        before_calls, built = dict(calls), worlds.built
        rpg.destroy_process_groups()
        built_in_destroy = worlds.built - built
        rpg.reload_process_groups()
        cycle = rpg.last_cycle_report()
        cycles.append(
            {
                "hooks": {k: calls[k] - before_calls[k] for k in calls},
                "worlds_built_in_destroy": built_in_destroy,
                "worlds_built": worlds.built - built,
                "report_cycle": None if cycle is None else cycle.cycle,
                "destroy_phases": (
                    None if cycle is None or cycle.destroy is None else sorted(cycle.destroy.phases)
                ),
                "sums": [total(None, ctx.rank + 1), total(pair, ctx.rank + 1)],
            }
        )
    out["cycles"] = cycles
    out["calls"] = calls
    return out


def test_destroy_before_init_does_nothing_and_the_real_cycles_are_whole() -> None:
    """``destroy_process_groups()`` before ``init_process_group()``: no hook, no report, no
    error. Then three real cycles each run both hooks once, sync, and swap WORLD (torch builds
    the temporary WORLD in the destroy and the restored one in the reload)."""
    for rank, report in enumerate(run_ranks(_destroy_before_init, 2, timeout=120, env=GATE)):
        assert report["initialized_before"] is False
        assert report["early"] == "no error", (rank, report)
        assert report["early_calls"] == {"before_destroy": 0, "after_reload": 0}, (rank, report)
        assert report["early_report"] is None, (rank, report)
        for number, cycle in enumerate(report["cycles"], start=1):
            assert cycle["hooks"] == {"before_destroy": 1, "after_reload": 1}, (rank, cycle)
            assert cycle["worlds_built_in_destroy"] == 1, (rank, cycle)
            assert cycle["worlds_built"] == 2, (rank, cycle)
            assert cycle["report_cycle"] == number, (rank, cycle)
            assert cycle["destroy_phases"] is not None, (rank, cycle)
            assert "sync" in cycle["destroy_phases"], (rank, cycle)
            assert cycle["sums"] == [3.0, 3.0], (rank, cycle)
        assert report["calls"] == {"before_destroy": 3, "after_reload": 3}, (rank, report)


# ---- 5. torch's process-global state is as it was after a swap --------------------------------


def _process_globals() -> dict[str, Any]:
    """Process-global state that torch's init_process_group / destroy_process_group (or
    anything a swap calls) could change: hooks, handlers, streams, environment, module globals.
    """
    import atexit
    import faulthandler
    import gc
    import logging
    import signal
    import threading
    import warnings

    from torch.distributed import distributed_c10d as c10d

    handlers = {}
    for sig in sorted(signal.valid_signals()):
        try:
            handlers[int(sig)] = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
    loggers = {"<root>": logging.getLogger()}
    loggers.update(
        (name, logger)
        for name, logger in logging.Logger.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    )
    return {
        "sys.excepthook": sys.excepthook,
        "threading.excepthook": threading.excepthook,
        "sys.unraisablehook": sys.unraisablehook,
        "sys.displayhook": sys.displayhook,
        "sys.breakpointhook": sys.breakpointhook,
        "sys.stdout": sys.stdout,
        "sys.stderr": sys.stderr,
        "sys.gettrace()": sys.gettrace(),
        "sys.getprofile()": sys.getprofile(),
        "sys.getrecursionlimit()": sys.getrecursionlimit(),
        "signal handlers": handlers,
        "atexit callbacks": atexit._ncallbacks(),
        "faulthandler.is_enabled()": faulthandler.is_enabled(),
        "gc.callbacks": list(gc.callbacks),
        "warnings.filters": list(warnings.filters),
        "os.environ": dict(os.environ),
        "sys.path": list(sys.path),
        "sys.meta_path": list(sys.meta_path),
        "logging.disable": logging.root.manager.disable,
        "loggers": {
            name: (
                tuple(logger.handlers),
                logger.level,
                logger.propagate,
                logger.disabled,
                tuple(logger.filters),
            )
            for name, logger in loggers.items()
        },
        "python threads": sorted(t.name for t in threading.enumerate()),
        "c10d._backend": c10d._backend,
        "c10d._default_pg_init_method": c10d._default_pg_init_method,
    }


#: A logger created after the first snapshot (a lazy import) is as torch's default makes it.
_NEW_LOGGER = ((), 0, True, False, ())


def _differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    out = []
    for key, old in before.items():
        new = after[key]
        if key == "loggers":
            for name in sorted(set(old) | set(new)):
                if old.get(name, _NEW_LOGGER) != new.get(name, _NEW_LOGGER):
                    out.append(f"logger {name!r}")
        elif isinstance(old, dict):
            for name in sorted(set(old) | set(new), key=str):
                if old.get(name, "<unset>") != new.get(name, "<unset>"):
                    out.append(f"{key}[{name!r}]: {old.get(name)!r} -> {new.get(name)!r}")
        elif old is not new and old != new:
            out.append(f"{key}: {old!r} -> {new!r}")
    return out


def _rendered_traceback() -> str:
    """What ``sys.excepthook`` prints for an uncaught exception now."""
    import io

    try:
        raise RuntimeError("uncaught in the rank")
    except RuntimeError:
        info = sys.exc_info()
    saved, sys.stderr = sys.stderr, io.StringIO()
    try:
        sys.excepthook(*info)
        return sys.stderr.getvalue()
    finally:
        sys.stderr = saved


def _globals_across_cycles(ctx: Rank) -> dict:
    import reloadpg_autopatch as rpg

    dist = world_ranks.begin(ctx)
    rpg.register_default_process_group(world_ranks.TIMEOUT, accelerator_backends=world_ranks.SWAP)
    hook = sys.excepthook  # torch's, from the real init_process_group
    first = _process_globals()
    worlds = world_ranks.DefaultGroups()
    steps = []
    for cycle in range(5):
        rpg.destroy_process_groups()
        asleep = _differences(first, _process_globals())
        rpg.reload_process_groups()
        steps.append(
            {
                "cycle": cycle + 1,
                "after_destroy": asleep,
                "after_reload": _differences(first, _process_globals()),
                "sum": total(dist.group.WORLD, 1.0),
            }
        )
    return {
        "torchs_hook": f"{hook.__module__}.{hook.__qualname__}",
        "same_hook": sys.excepthook is hook,
        "steps": steps,
        "worlds_built": worlds.built,
        "traceback": _rendered_traceback(),
    }


def _prefixes(text: str, marker: str) -> list[int]:
    """``[rank0]: `` prefixes on each line of the traceback that ends at ``marker``."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    ends = [i for i, line in enumerate(lines) if marker in line and "raise" not in line]
    assert len(starts) == 1, text[-4000:]
    assert ends, text[-4000:]
    return [line.count("[rank0]: ") for line in lines[starts[0] : ends[-1] + 1] if line]


def test_a_swap_leaves_torchs_process_globals_as_they_were() -> None:
    """Five cycles on one rank: after each destroy and each reload, ``sys.excepthook`` is still
    torch's first hook and no other process-global state differs from before the first cycle;
    an uncaught exception prints one ``[rank0]: `` per line."""
    (report,) = run_ranks(_globals_across_cycles, 1, timeout=90, env=GATE)
    assert report["torchs_hook"].startswith("torch.distributed"), report["torchs_hook"]
    assert report["worlds_built"] == 10, report  # every cycle really swapped WORLD
    for step in report["steps"]:
        assert step["after_destroy"] == [], step
        assert step["after_reload"] == [], step
        assert step["sum"] == 1.0, step
    assert report["same_hook"], report
    assert set(_prefixes(report["traceback"], "uncaught in the rank")) == {1}, report["traceback"]


CYCLES = 1000


@pytest.mark.timeout(240)
def test_an_uncaught_exception_after_a_thousand_cycles_prints_one_prefix_per_line(
    tmp_path,
) -> None:
    """1,000 swaps, then an uncaught exception: its traceback printed once, each line with one
    ``[rank0]: `` (torch's hook from the real init), no RecursionError. About 25 s here."""
    proc = subprocess.run(
        [sys.executable, str(PROGRAMS / "cycles_then_raise.py"), str(CYCLES)],
        env=clean_env(PYTHONPATH=str(ROOT), **GATE),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=220,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, (proc.stdout[-2000:], proc.stderr[-2000:])
    summary = json.loads(lines[-1])
    assert summary["patched"], summary
    assert summary["worlds_built"] == 2 * CYCLES, summary  # each cycle swapped WORLD
    assert proc.returncode == 1, proc.stderr[-3000:]  # the uncaught exception's exit status
    stderr = proc.stderr
    assert "RecursionError" not in stderr, stderr[-3000:]
    assert "Error in sys.excepthook" not in stderr, stderr[-3000:]
    assert stderr.count("Traceback (most recent call last)") == 1, stderr[-3000:]
    assert set(_prefixes(stderr, "uncaught after the cycles")) == {1}, stderr[-3000:]


# ---- 6. a hook that re-enters the step ----------------------------------------------------------

REENTRY = re.compile(r"re-?ent|reentr|inside a reload hook|from a reload hook|same thread", re.I)


def _reentering_hooks(ctx: Rank) -> dict:
    import reloadpg_autopatch as rpg

    dist = world_ranks.begin(ctx)
    group = dist.new_group([0])

    def destroys(groups: list[Any]) -> None:
        rpg.destroy_process_groups()

    def reloads(groups: list[Any]) -> None:
        rpg.reload_process_groups()

    handles = [
        rpg.add_reload_hook(before_destroy=destroys, name="calls destroy"),
        rpg.add_reload_hook(after_reload=reloads, name="calls reload"),
    ]
    out: dict[str, Any] = {}
    for step, call in (
        ("destroy", rpg.destroy_process_groups),
        ("reload", rpg.reload_process_groups),
    ):
        try:
            call()
            out[step] = {"error": None}
        except Exception as error:
            cause = error.__cause__
            out[step] = {
                "error": world_ranks.error_text(error),
                "hook_error": isinstance(error, rpg.ReloadHookError),
                "cause": None if cause is None else world_ranks.error_text(cause),
            }
    for handle in handles:
        handle.remove()
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    out["sum"] = total(group, 1.0)
    return out


def test_a_hook_that_calls_the_step_is_told_it_re_entered() -> None:
    """A ``before_destroy`` hook calling ``destroy_process_groups()`` and an ``after_reload``
    hook calling ``reload_process_groups()``: each step raises ``ReloadHookError`` whose cause
    says the step was re-entered from a hook, not that another thread runs it."""
    (report,) = run_ranks(_reentering_hooks, 1, timeout=90, env=GATE)
    for step in ("destroy", "reload"):
        outcome = report[step]
        assert outcome["error"] is not None, (step, outcome)
        assert outcome["hook_error"], (step, outcome)
        cause = outcome["cause"]
        assert cause is not None, (step, outcome)
        assert REENTRY.search(cause), (step, cause)
        assert "another thread" not in cause, (step, cause)
    assert report["sum"] == 1.0, report
