"""The suspend watchdog takes nothing the program owns, and ends a process only for a stuck call.

A training program may arm its own hang detector with ``faulthandler.dump_traceback_later``
(one timer per process), handle signals and set ``sys.excepthook``; none of it may change under
it, however many cycles run, in any mode (issue 33, item 4). The watchdog ends the process only
when a ``suspend()`` or ``resume()`` outlives its timeout: never after a call that returned, nor
one timeout after a call that raised; then every rank ends by SIGABRT, naming the group, the
call and the cycle, and a call stuck holding the GIL is ended by the backstop. One watchdog
thread per process, and none while nothing sleeps.

The oracles are outside the package: faulthandler's own output in a file the program gave it,
``signal.getsignal`` and the hooks' identities before and after, the clock, and the exit status
and stderr of each rank (ranks run as plain subprocesses where the watchdog must end them).
Suspend runs on the stand-in of ``reloadpg_autopatch/tools/cpu_nccl`` (no GPU here).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from reloadpg_autopatch.tools import cpu_nccl as suspendable
from tests.support import PROGRAMS, ROOT
from tests.support.ranks import GATE, HOST, Rank, run_ranks

pytestmark = pytest.mark.timeout(240)

ON_214 = suspendable.python_backend_available()
#: The watchdog's timeout in the ranks, and the backstop's margin after it (set in the rank).
TIMEOUT_S = 1.5
BACKSTOP_S = 0.5
#: The program's own faulthandler timer, armed right before the first destroy.
PROGRAM_TIMER_S = 3
MODES = [
    "wrapper",
    "suspend",
    "auto",
    pytest.param(
        "native",
        marks=pytest.mark.skipif(
            not ON_214, reason="native mode reloads in place: torch 2.14's ProcessGroup.reconfigure"
        ),
    ),
]

_RUNS: dict[str, Any] = {}


def _globals() -> dict[str, Any]:
    """What a program owns process-wide: every signal's handler, the three hooks, and whether
    faulthandler is enabled (its timer cannot be read: its output is the oracle)."""
    import faulthandler
    import threading

    handlers = {}
    for sig in signal.valid_signals():
        try:
            handlers[int(sig)] = signal.getsignal(sig)
        except (ValueError, OSError):  # glibc's reserved real-time signals
            continue
    return {
        "handlers": handlers,
        "sys.excepthook": sys.excepthook,
        "threading.excepthook": threading.excepthook,
        "sys.unraisablehook": sys.unraisablehook,
        "faulthandler enabled": faulthandler.is_enabled(),
    }


def _cycles_under_a_program(ctx: Rank, mode: str) -> dict[str, Any]:
    """A program that owns faulthandler's timer, a signal handler and the hooks runs three
    cycles in ``mode``; in suspend and auto, one group's suspend and another's resume raise."""
    import faulthandler
    import tempfile
    import threading
    import warnings
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.groups import watchdog
    from reloadpg_autopatch.tools import cpu_nccl as s

    warnings.simplefilter("ignore", FutureWarning)
    watchdog.BACKSTOP_S = BACKSTOP_S  # the same backstop, due sooner: a shorter wait here
    assert rpg.is_patched()
    s.register()
    rpg.set_reload_mode(mode)
    rpg.set_wrap_policy("all")
    ctx.init(timeout=30.0)
    # The program's own: a handler, the hooks, faulthandler on (its signal handlers).
    signal.signal(signal.SIGUSR1, lambda *_: None)
    sys.excepthook = lambda *a: print("program's hook", *a)
    threading.excepthook = lambda args: None
    faulthandler.enable()
    if mode in ("wrapper", "native"):
        # wrapper: WORLD swaps for a temporary WORLD (init_process_group chains the hooks).
        rpg.register_default_process_group(timedelta(seconds=30), accelerator_backends=("gloo",))
    groups = {"gloo": dist.new_group([0, 1], group_desc="gloo-pair")}
    if mode in ("suspend", "auto"):
        groups["standin"] = dist.new_group([0, 1], backend=s.NAME_A, group_desc="standin")
        s.configure(fail_after_barrier="suspend")
        groups["bad-suspend"] = dist.new_group([0, 1], backend=s.NAME_A, group_desc="bad-s")
        s.configure(fail_after_barrier="resume")
        groups["bad-resume"] = dist.new_group([0, 1], backend=s.NAME_A, group_desc="bad-r")
        s.configure()
    before = _globals()
    dump = tempfile.TemporaryFile("w+")  # noqa: SIM115 - the rank's process ends with it
    armed = time.monotonic()
    faulthandler.dump_traceback_later(PROGRAM_TIMER_S, file=dump)
    outcomes = []
    for cycle in range(3):
        for step in (rpg.destroy_process_groups, rpg.reload_process_groups):
            try:
                step()
                outcomes.append("ok")
            except rpg.GroupBrokenError:
                outcomes.append("broken")
        if cycle == 0:
            dump.seek(0, os.SEEK_END)
            empty_after_first_cycle = dump.tell() == 0
    last_call = time.monotonic()
    after_cycles = _globals()
    suspends = [c for c in s.CALLS if c.op in ("suspend", "resume")]
    # Past the program's timer, and past the watchdog's timeout and backstop after the last
    # suspend or resume: the watchdog must not end this rank now.
    deadline = max(armed + PROGRAM_TIMER_S + 1.5, last_call + TIMEOUT_S + BACKSTOP_S + 1.0)
    time.sleep(max(0.0, deadline - time.monotonic()))
    dump.seek(0)
    out = dump.read()
    t = torch.tensor([1.0])
    dist.all_reduce(t, group=groups["gloo"])
    return {
        "outcomes": outcomes,
        "empty after first cycle": empty_after_first_cycle,
        "dump": out,
        "same": {k: before[k] == after_cycles[k] for k in before},
        "changed signals": sorted(
            n for n in before["handlers"] if before["handlers"][n] != after_cycles["handlers"][n]
        ),
        "suspend calls": len(suspends),
        "alive sum": t.item(),
        "waited past last call": time.monotonic() - last_call,
    }


def _run(mode: str) -> list[dict[str, Any]]:
    if mode not in _RUNS:
        env = {**GATE, "SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT": str(TIMEOUT_S)}
        _RUNS[mode] = run_ranks(_MODE_FNS[mode], 2, timeout=120, env=env)
    return _RUNS[mode]


def _wrapper(ctx: Rank) -> dict[str, Any]:
    return _cycles_under_a_program(ctx, "wrapper")


def _suspend(ctx: Rank) -> dict[str, Any]:
    return _cycles_under_a_program(ctx, "suspend")


def _auto(ctx: Rank) -> dict[str, Any]:
    return _cycles_under_a_program(ctx, "auto")


def _native(ctx: Rank) -> dict[str, Any]:
    return _cycles_under_a_program(ctx, "native")


_MODE_FNS = {"wrapper": _wrapper, "suspend": _suspend, "auto": _auto, "native": _native}


@pytest.mark.parametrize("mode", MODES)
def test_the_programs_faulthandler_timer_fires_after_cycles(mode: str) -> None:
    """The program arms ``dump_traceback_later`` before its first destroy; three cycles later
    (in suspend and auto, each with suspends and resumes under the watchdog) faulthandler
    still writes its dump when the program's timer is due, and not before. Each run waits
    for the program's timer (about 5 s)."""
    for rank, out in enumerate(_run(mode)):
        assert out["empty after first cycle"], (rank, out["dump"][:500])
        assert f"Timeout (0:00:0{PROGRAM_TIMER_S})!" in out["dump"], (rank, out["dump"][:500])
        if mode in ("suspend", "auto"):
            assert out["suspend calls"] >= 6, (rank, out)  # the watchdog was armed


@pytest.mark.parametrize("mode", MODES)
def test_signal_handlers_and_hooks_are_as_the_program_left_them(mode: str) -> None:
    """Every signal's handler, ``sys.excepthook``, ``threading.excepthook``,
    ``sys.unraisablehook`` and faulthandler's state are the program's after three cycles."""
    for rank, out in enumerate(_run(mode)):
        assert out["changed signals"] == [], (rank, out["changed signals"])
        assert all(out["same"].values()), (rank, out["same"])


@pytest.mark.parametrize("mode", ["suspend", "auto"])
def test_the_watchdog_never_ends_a_rank_after_its_calls_returned_or_raised(mode: str) -> None:
    """Each cycle suspends and resumes three groups, one whose suspend raises and one whose
    resume raises (``GroupBrokenError``); each rank then lives past the watchdog's timeout
    and its backstop after the last call, and still runs a collective (a rank the watchdog
    ended would fail the run)."""
    for rank, out in enumerate(_run(mode)):
        assert "broken" in out["outcomes"], (rank, out["outcomes"])
        assert out["waited past last call"] >= TIMEOUT_S + BACKSTOP_S + 0.5, (rank, out)
        assert out["alive sum"] == 2.0


# ---- a call that holds the GIL: the backstop -------------------------------------------------


def test_a_stuck_call_holding_the_gil_is_ended_by_the_backstop() -> None:
    """A ``suspend()`` stuck in C code that holds the GIL (no Python thread can run, the
    watchdog's own included) still ends the process: the backstop, a POSIX timer of the
    watchdog's own, signals it ``BACKSTOP_S`` after the timeout. That rank ends by SIGABRT
    about then, without the watchdog's message (its thread never ran); its peer, waiting in
    the barrier without the GIL, is ended by the watchdog at the timeout. About 10 s: two
    fresh interpreters, a 2 s timeout and the backstop's real 5 s margin after it."""
    from reloadpg_autopatch.groups.watchdog import BACKSTOP_S as MARGIN

    limit = 2.0
    env = {"SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT": str(limit), "WATCHDOG_WORLD_TIMEOUT": "60"}
    runs = _watchdog_run(0, "gil@1", env)
    for rank, run in enumerate(runs):
        assert run["returncode"] == -signal.SIGABRT, (
            rank,
            run["returncode"],
            run["stderr"][-3000:],
        )
        assert "RETURNED" not in run["stdout"]
        assert run["step"] == "destroy", (rank, run["step"])
    said = ["did not return within" in run["stderr"] for run in runs]
    assert said == [True, False], [run["stderr"][-2000:] for run in runs]
    assert limit - 0.5 <= runs[0]["seconds"] <= limit + 6.0, runs[0]["seconds"]
    assert limit + MARGIN - 0.5 <= runs[1]["seconds"] <= limit + MARGIN + 6.0, runs[1]["seconds"]


# ---- one thread per process (issue 39, item 4) -------------------------------------------------

CYCLES = 10


def _threads_over_cycles(ctx: Rank) -> dict[str, Any]:
    """Ten suspend-mode cycles of two groups on the stand-in (four watched calls a cycle),
    counting every thread started (``threading.Thread.start``, whoever calls it) and the
    threads alive while asleep and once awake again."""
    import threading
    import warnings

    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.tools import cpu_nccl as s

    warnings.simplefilter("ignore", FutureWarning)
    assert rpg.is_patched()
    s.register()
    rpg.set_reload_mode("suspend")
    ctx.init(timeout=30.0)
    groups = [dist.new_group([0, 1], backend=s.NAME_A) for _ in range(2)]
    for group in groups:
        dist.barrier(group=group)  # its communicator exists: every cycle suspends it
    started: list[str] = []
    original = threading.Thread.start

    def start(self: threading.Thread) -> None:
        started.append(self.name)
        original(self)

    threading.Thread.start = start  # type: ignore[method-assign]
    baseline = {t.ident for t in threading.enumerate()}

    def extra() -> int:
        return len({t.ident for t in threading.enumerate() if t.is_alive()} - baseline)

    asleep, awake = [], []
    try:
        for _ in range(CYCLES):
            rpg.destroy_process_groups()
            asleep.append(extra())
            rpg.reload_process_groups()
            awake.append(extra())
    finally:
        threading.Thread.start = original  # type: ignore[method-assign]
    suspends = [c for c in s.CALLS if c.op in ("suspend", "resume")]
    return {"started": started, "asleep": asleep, "awake": awake, "calls": len(suspends)}


def test_one_watchdog_thread_per_process_and_none_while_nothing_sleeps() -> None:
    """Four watched calls a cycle (two groups suspended and resumed) start at most one thread
    a cycle in all, never more than one alive while the groups sleep, and none once they are
    awake again: the watchdog arms and disarms its deadline per call in one thread."""
    env = {**GATE, "SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT": "30"}
    for rank, out in enumerate(run_ranks(_threads_over_cycles, 2, timeout=120, env=env)):
        assert out["calls"] >= 4 * CYCLES, (rank, out["calls"])  # every call was watched
        assert len(out["started"]) <= CYCLES, (rank, out["started"])
        assert max(out["asleep"]) <= 1, (rank, out["asleep"])
        assert out["awake"] == [0] * CYCLES, (rank, out["awake"])


# ---- a suspend or resume that never returns (ranks as plain subprocesses) ------------------------


def _watchdog_run(
    warm: int, hang: str, env: dict[str, str], deadline: float = 90.0
) -> list[dict[str, Any]]:
    """Start two ranks of ``programs/suspend_watchdog.py`` on a TCPStore of this process; wait
    for both to end (killing them at ``deadline``); return each one's status, stderr, and the
    seconds from its last MARK to its end. Subprocesses, not ``run_ranks``: the watchdog ends
    the process with SIGABRT and its stacks on stderr, which is what the test reads."""
    import torch.distributed as dist

    server = dist.TCPStore(HOST, 0, 2, is_master=True, wait_for_workers=False)
    full = {**os.environ, **GATE, **env}
    # ``tests`` must import; a package copy named earlier on the path still wins.
    paths = [p for p in full.get("PYTHONPATH", "").split(os.pathsep) if p]
    full["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT)])
    procs, logs = [], []
    program = str(PROGRAMS / "suspend_watchdog.py")
    for rank in range(2):
        log = open(  # noqa: SIM115 - closed below, after the process ends
            Path(os.environ.get("TMPDIR", "/tmp")) / f"suspend-watchdog-{os.getpid()}-{rank}.log",
            "w+",
        )
        args = [sys.executable, program, HOST, str(server.port), str(rank), "2", str(warm), hang]
        procs.append(subprocess.Popen(args, env=full, stdout=subprocess.PIPE, stderr=log))
        logs.append(log)
    ended: dict[int, float] = {}
    stop = time.monotonic() + deadline
    while len(ended) < 2 and time.monotonic() < stop:
        for rank, proc in enumerate(procs):
            if rank not in ended and proc.poll() is not None:
                ended[rank] = time.time()
        time.sleep(0.05)
    results = []
    for rank, (proc, log) in enumerate(zip(procs, logs, strict=True)):
        if proc.poll() is None:
            proc.kill()
        stdout = proc.communicate(timeout=10)[0].decode(errors="replace")
        log.seek(0)
        stderr = log.read()
        log.close()
        os.unlink(log.name)
        marks = [line.split() for line in stderr.splitlines() if line.startswith("MARK ")]
        last = float(marks[-1][2]) if marks else None
        results.append(
            {
                "returncode": proc.returncode,
                "stdout": stdout,
                "stderr": stderr,
                "step": marks[-1][1] if marks else None,
                "seconds": (ended[rank] - last) if rank in ended and last else None,
            }
        )
    del server
    return results


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("phase", "warm", "hang", "env", "limit"),
    [
        pytest.param(
            "suspend", 0, "-", {"SUSPENDABLE_HANG": "suspend@1"}, 3.0, id="suspend-env-timeout"
        ),
        pytest.param("resume", 1, "resume@1", {}, 3.0, id="resume-cycle2-env-timeout"),
        pytest.param("suspend", 0, "suspend@0", {}, None, id="suspend-world-timeout"),
    ],
)
def test_a_suspend_or_resume_that_never_returns_aborts_every_rank(
    phase: str, warm: int, hang: str, env: dict[str, str], limit: float | None
) -> None:
    """One rank's ``suspend()`` or ``resume()`` never arrives (its peer waits in the barrier):
    both ranks end by SIGABRT no sooner than the suspend timeout
    (``SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT``, else WORLD's) and within a few seconds of it,
    and each one's stderr names the group, the call and the cycle, with the stacks."""
    world_timeout = 4.0
    env = {**env, "WATCHDOG_WORLD_TIMEOUT": str(world_timeout if limit is None else 60)}
    if limit is not None:
        env["SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT"] = str(limit)
    seconds = world_timeout if limit is None else limit
    cycle = warm + 1
    step = "destroy" if phase == "suspend" else "reload"
    for rank, run in enumerate(_watchdog_run(warm, hang, env)):
        err = run["stderr"]
        assert run["returncode"] == -signal.SIGABRT, (rank, run["returncode"], err[-3000:])
        assert "RETURNED" not in run["stdout"]
        assert run["step"] == step, (rank, run["step"])
        assert seconds - 0.5 <= run["seconds"] <= seconds + 6.0, (rank, run["seconds"])
        assert "tp-watched" in err, err[-3000:]
        assert f"{phase}()" in err, err[-3000:]
        assert f"cycle {cycle}, {step}" in err, err[-3000:]
        assert "most recent call first" in err, err[-3000:]  # faulthandler's stacks
