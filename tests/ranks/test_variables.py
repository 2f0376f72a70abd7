"""Every variable is checked once, at its first read, in one line that names what is accepted.

A process that cycles thousands of times must not repeat a complaint at every step, a value
that is accepted must give what it promises (a suspend timeout the watchdog can time), and a
value that is not understood must never be ignored without a word (issue 33, item 5). Every
spelling of the gate and of the guard's every-call switch is accepted as documented, and a bogus
mode falls back to exactly ``wrapper``, saying so in one line.

The oracle is the stderr of fresh interpreters (the start-up layer reads the gate, the log
level, the mode and the rebind prefixes before any user code, so start-up is the subject here):
``tests/support/programs/bad_variables.py`` runs several cycles in suspend mode on the stand-in
with one bad value in every variable, and each variable must appear in exactly one line; the
interpreter's ``sys.meta_path`` against the gate-unset run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from reloadpg_autopatch import _env
from tests.support import PROGRAMS, ROOT, registered_world, this_tree
from tests.support.ranks import GATE, Rank, run_ranks, total

if TYPE_CHECKING:  # only a type checker sees it: the probes of the rule test name it as text
    pass

pytestmark = pytest.mark.timeout(180)

CYCLES = 4

#: Per variable: what its one line must say is accepted.
ACCEPTED = {
    _env.GATE: "1, true, yes, on",
    _env.LOG_ENV: "DEBUG, INFO",
    _env.MODE_ENV: "wrapper, native, suspend, auto",
    _env.REBIND_ENV: "'megatron'",
    _env.MIN_FREE_ENV: "accepted: 0 (the memory guard off) or a positive number up to",
    _env.EVERY_CALL_ENV: "accepted: 1, true",
    _env.SUSPEND_TIMEOUT_ENV: "accepted: a positive number up to 1e+09",
    _env.SUSPEND_MIN_FREED_ENV: "accepted: a number from 0 (always suspend) to 1",
    _env.FAIL_ENV: "accepted: patch",
}

#: Two sets of bad values, one per run: the gate activates the first, the second runs with a
#: gate that is not understood and patches explicitly (so the lifecycle reads the mode first).
BAD = {
    "gate": {
        _env.GATE: "1",
        _env.LOG_ENV: "loud",
        _env.MODE_ENV: "sideways",
        _env.REBIND_ENV: "9bad",
        _env.MIN_FREE_ENV: "inf",
        _env.EVERY_CALL_ENV: "sometimes",
        _env.SUSPEND_TIMEOUT_ENV: "1e12",
        _env.SUSPEND_MIN_FREED_ENV: "half",  # read by an auto destroy alone: start-up says it
        _env.FAIL_ENV: "junk",
    },
    "explicit": {
        _env.GATE: "maybe",
        _env.MODE_ENV: "suspend!",
        _env.MIN_FREE_ENV: "1e999",
        _env.EVERY_CALL_ENV: "2",
        _env.SUSPEND_TIMEOUT_ENV: "nan",
        _env.FAIL_ENV: "patch please",
    },
}

_RUNS: dict[str, tuple[int, str, str]] = {}


def _run(how: str) -> tuple[int, str, str]:
    if how not in _RUNS:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLIME_RELOADABLE_PG")}
        env.update(BAD[how])
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT)])
        proc = subprocess.run(
            [sys.executable, str(PROGRAMS / "bad_variables.py"), how, str(CYCLES)],
            env=env,
            capture_output=True,
            text=True,
            timeout=150,
            check=False,
        )
        _RUNS[how] = (proc.returncode, proc.stdout, proc.stderr)
    return _RUNS[how]


def _lines_naming(stderr: str, variable: str) -> list[str]:
    """The lines that name ``variable`` itself (not a longer name it is the start of)."""
    pattern = re.compile(re.escape(variable) + r"(?![A-Z_])")
    return [line for line in stderr.splitlines() if pattern.search(line)]


@pytest.mark.parametrize("how", ["gate", "explicit"])
def test_each_bad_value_gives_exactly_one_line_over_many_cycles(how: str) -> None:
    """Every variable set to a bad value is named in exactly one stderr line, which says what
    is accepted, though the process read most of them at every step of several cycles (the
    stand-in's log shows the suspends ran: the suspend timeout was read each time); with the
    gate, that line is start-up's, prefixed ``reloadpg_autopatch:``. An infinite memory
    threshold (``inf``, ``1e999``) is one such value: the cycles run on the default."""
    code, out, err = _run(how)
    assert code == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["patched"], err[-3000:]
    assert result["modes"] == ["wrapper"]  # a bad mode means the default
    assert result["suspends"] == CYCLES, result
    for variable, value in BAD[how].items():
        lines = _lines_naming(err, variable)
        if variable == _env.GATE and value == "1":
            assert lines == [], lines  # a good gate says nothing
            continue
        assert len(lines) == 1, (variable, lines, err[-3000:])
        assert ACCEPTED[variable] in lines[0], (variable, lines[0])
        if how == "gate":  # start-up says each one, in its own line, as it says the gate's
            assert lines[0].startswith(f"reloadpg_autopatch: {variable}"), (variable, lines)


def test_no_line_for_good_values() -> None:
    """The same program with good values in every variable says nothing about any of them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLIME_RELOADABLE_PG")}
    env.update(
        {
            _env.GATE: "1",
            _env.LOG_ENV: "warning",
            _env.MODE_ENV: "wrapper",
            _env.REBIND_ENV: "megatron",
            _env.MIN_FREE_ENV: "0",
            _env.EVERY_CALL_ENV: "0",
            _env.SUSPEND_TIMEOUT_ENV: "1e9",
        }
    )
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT)])
    proc = subprocess.run(
        [sys.executable, str(PROGRAMS / "bad_variables.py"), "gate", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["suspends"] == 2
    named = [line for line in proc.stderr.splitlines() if "SLIME_RELOADABLE_PG" in line]
    assert named == [], named


# ---- the values themselves (one process) -----------------------------------------------------


@pytest.mark.parametrize("raw", ["abc", "0", "-5", "nan", "inf", "-inf", "1e12", "1000000001", ""])
def test_a_suspend_timeout_outside_what_the_watchdog_can_time_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match=r"accepted: a positive number up to 1e\+09"):
        _env.parse_suspend_timeout(raw)


@pytest.mark.parametrize("raw", ["0.001", "1.5", " 600 ", "1e9"])
def test_an_accepted_suspend_timeout_is_taken_as_given(raw: str) -> None:
    assert _env.parse_suspend_timeout(raw) == float(raw)


@pytest.mark.parametrize("raw", ["abc", "-0.1", "1.01", "nan", "inf", "-inf", "1e999", ""])
def test_a_suspend_min_freed_outside_zero_to_one_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match=r"SLIME_RELOADABLE_PG_SUSPEND_MIN_FREED=.*from 0"):
        _env.parse_suspend_min_freed(raw)


@pytest.mark.parametrize("raw", ["0", "0.5", " 1 ", "0.05"])
def test_an_accepted_suspend_min_freed_is_taken_as_given(raw: str) -> None:
    assert _env.parse_suspend_min_freed(raw) == float(raw)


def test_the_longest_accepted_timeout_gives_a_working_watchdog() -> None:
    """``1e9`` s (the longest accepted) and WORLD's longest timeout arm a watchdog whose thread
    waits (``threading.Timer`` raised ``OverflowError`` in its thread for ``1e12`` before).
    Each time, the one thread is started for the call and ended once nothing is watched."""
    from datetime import timedelta

    from reloadpg_autopatch.groups import watchdog

    died: list[BaseException] = []
    saved = threading.excepthook
    threading.excepthook = lambda args: died.append(args.exc_value)
    try:
        for seconds in (
            _env.parse_suspend_timeout("1e9"),
            watchdog.suspend_timeout(timedelta.max),
        ):
            before = set(threading.enumerate())
            with watchdog.watched("a test's call", seconds):
                time.sleep(0.2)
                started = [t for t in set(threading.enumerate()) - before if t.is_alive()]
            assert len(started) == 1, started  # the watchdog's thread, waiting
            watchdog.idle()  # as when nothing sleeps any more: the thread ends
    finally:
        threading.excepthook = saved
    assert died == []


@pytest.mark.parametrize(
    ("variable", "problem"),
    [
        (_env.MODE_ENV, _env.mode_problem),
        (_env.FAIL_ENV, _env.failure_problem),
    ],
)
def test_the_accepted_values_say_nothing(variable: str, problem: object) -> None:
    accepted = {_env.MODE_ENV: _env.MODES, _env.FAIL_ENV: _env.FAILURES}[variable]
    for value in (None, "", "  ", *accepted, *(v.upper() for v in accepted)):
        assert problem(value) is None, (variable, value)  # type: ignore[operator]
    assert variable in problem("nonsense")  # type: ignore[operator]


# ---- what a cycle raises ------------------------------------------------------------------------


def _cycle_with_an_unchecked_threshold(ctx: Any) -> dict[str, Any]:
    """One rank, one group; the guard's threshold set to infinity behind the checks (as the
    environment gave it before they refused it), so the reload's preflight meets an
    ``OverflowError`` that is not the package's own."""
    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.groups import settings
    from reloadpg_autopatch.groups.settings import MemoryGuard

    dist = ctx.begin()
    group = dist.new_group([0])
    rpg.destroy_process_groups()
    settings.current().guard = MemoryGuard(float("inf"), False)
    out: dict[str, Any] = {}
    try:
        rpg.reload_process_groups()
        out["reload"] = None
    except Exception as error:
        cause = error.__cause__
        out["reload"] = [type(error).__name__, isinstance(error, rpg.ReloadPGError), str(error)]
        out["cause"] = None if cause is None else type(cause).__name__
    settings.current().guard = MemoryGuard(0.0, False)
    rpg.reload_process_groups()  # the groups still sleep: a reload after the fix wakes them
    out["sum"] = total(group, 1.0)
    return out


def test_nothing_a_cycle_raises_is_outside_reload_pg_error() -> None:
    """A failure inside a cycle that is not one of the package's own (here an
    ``OverflowError`` from an infinite threshold) reaches the program as a ``ReloadPGError``
    naming it, with the original as its cause; the groups still sleep and a reload wakes
    them."""
    (out,) = run_ranks(_cycle_with_an_unchecked_threshold, 1, timeout=60, env=GATE)
    _kind, ours, text = out["reload"]
    assert ours, out
    assert "OverflowError" in text, out
    assert out["cause"] == "OverflowError", out
    assert out["sum"] == 1.0, out


# ---- every spelling of the gate and of the guard's switch; a bogus mode --------------------------


ON_SPELLINGS = ["1", " 1 ", "true", "TRUE", " True\t", "yes", "YES ", " yEs", "on", "ON", " On\t"]
OFF_SPELLINGS = ["", "   ", "0", " 0 ", "false", "FALSE", " False ", "no", " NO", "off", "Off\t"]

_META_PATH = (
    "import sys; print(sorted(getattr(f, '__module__', None) or type(f).__module__ "
    "for f in sys.meta_path))"
)


@pytest.mark.timeout(300)
def test_p4_every_accepted_spelling_of_the_gate() -> None:
    """Each spelling of ``1 true yes on`` (any case, blanks around) installs the start-up import
    hook, silently; each of ``"" 0 false no off`` leaves the interpreter as with the variable
    unset. Oracle: the interpreter's ``sys.meta_path`` against the gate-unset run; then one
    spelling of each kind end to end, by what ``new_group`` returns after ``import torch``."""
    baseline = this_tree.python(_META_PATH, this_tree.env())
    assert baseline.returncode == 0, baseline.stderr
    for value in ON_SPELLINGS + OFF_SPELLINGS:
        proc = this_tree.python(_META_PATH, this_tree.env(SLIME_RELOADABLE_PG=value))
        assert proc.returncode == 0, (value, proc.stderr)
        assert proc.stderr == "", (value, proc.stderr)
        hooked = proc.stdout != baseline.stdout
        assert hooked is (value in ON_SPELLINGS), (value, proc.stdout, baseline.stdout)
    end_to_end = (
        "import torch.distributed as dist\n"
        "import reloadpg_autopatch as rpg\n"
        "rpg.set_wrap_policy('all')\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "print(type(dist.new_group([0])).__name__)\n"
    )
    for value, expected in ((" yEs\t", "ReloadableProcessGroup"), (" OFF ", "ProcessGroup")):
        proc = this_tree.python(end_to_end, this_tree.env(SLIME_RELOADABLE_PG=value))
        assert proc.returncode == 0, (value, proc.stderr)
        assert proc.stdout.split() == [expected], (value, proc.stdout, proc.stderr)


_GUARD_FROM_ENV = r"""
import json, logging, os, sys
import torch.distributed
import reloadpg_autopatch as rpg

cases = json.loads(sys.argv[1])
for name, value in cases:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a fresh read of the environment: nothing read it in the parent
        os.close(read)
        warnings = []

        class Keep(logging.Handler):
            def emit(self, record):
                warnings.append(record.getMessage())

        logging.getLogger("reloadpg_autopatch").addHandler(Keep(logging.WARNING))
        os.environ[name] = value
        guard = rpg.get_memory_guard()
        os.write(write, json.dumps([guard.min_free_gb, guard.every_call, warnings]).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.waitpid(pid, 0)
    print(json.dumps([name, value, json.loads(b"".join(chunks))]))
"""


def _guards_from_env(cases: list[tuple[str, str]]) -> list[tuple[str, str, list]]:
    proc = subprocess.run(
        [sys.executable, "-c", _GUARD_FROM_ENV, json.dumps(cases)],
        env=this_tree.env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(ROOT),
    )
    assert proc.returncode == 0, proc.stderr
    return [tuple(json.loads(line)) for line in proc.stdout.splitlines()]


@pytest.mark.timeout(300)
def test_p4_every_call_switch_spellings_and_inf_from_the_environment() -> None:
    """``SLIME_RELOADABLE_PG_MEMORY_GUARD_EVERY_CALL``: every spelling of on turns it on and
    every spelling of off leaves it off, without a warning; ``SLIME_RELOADABLE_PG_MIN_FREE_GB=inf``
    is refused in one warning naming the variable, and the default used (issue 38: every number
    is finite and in range, or refused). Each read in a fresh forked child."""
    every = "SLIME_RELOADABLE_PG_MEMORY_GUARD_EVERY_CALL"
    cases = [(every, v) for v in ON_SPELLINGS + OFF_SPELLINGS]
    cases.append(("SLIME_RELOADABLE_PG_MIN_FREE_GB", "inf"))
    results = _guards_from_env(cases)
    assert len(results) == len(cases), results
    for name, value, (min_free, every_call, warnings) in results:
        if name == every:
            assert warnings == [], (name, value, warnings)
            assert every_call is (value in ON_SPELLINGS), (value, every_call)
            assert min_free == 3.0, (value, min_free)
        else:
            assert len(warnings) == 1, (name, value, warnings)
            assert "SLIME_RELOADABLE_PG_MIN_FREE_GB='inf'" in warnings[0], warnings
            assert min_free == 3.0, (value, min_free)
            assert every_call is False


@pytest.mark.timeout(300)
def test_p4_a_bogus_mode_falls_back_to_exactly_wrapper_with_one_stderr_line() -> None:
    code = (
        "import torch.distributed as dist\n"
        "import reloadpg_autopatch as rpg\n"
        "print(rpg.get_reload_mode())\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "rpg.set_wrap_policy('all')\n"
        "print(type(dist.new_group([0])).__name__)\n"
    )
    proc = this_tree.python(
        code, this_tree.env(SLIME_RELOADABLE_PG="1", SLIME_RELOADABLE_PG_MODE="bogus")
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["wrapper", "ReloadableProcessGroup"], proc.stdout
    ours = [line for line in proc.stderr.splitlines() if line.startswith("reloadpg_autopatch")]
    assert len(ours) == 1, proc.stderr
    assert "SLIME_RELOADABLE_PG_MODE" in ours[0], ours
    assert "'bogus'" in ours[0], ours
    assert "wrapper" in ours[0], ours


def _bogus_mode(ctx: Rank) -> dict:
    dist = registered_world.start(ctx, register=False)
    return {"type": type(dist.new_group([0, 1])).__name__}


@pytest.mark.timeout(300)
def test_a_bogus_mode_leaves_the_wrapper_mode() -> None:
    env = {**GATE, "SLIME_RELOADABLE_PG_MODE": "bogus"}
    for report in run_ranks(_bogus_mode, 2, env=env):
        assert report["type"] == "ReloadableProcessGroup"
