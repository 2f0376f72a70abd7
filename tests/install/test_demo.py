"""``python -m reloadpg_autopatch demo``, run as the README says, from an installed package."""

from __future__ import annotations

import json
import re
import socket
import time
from importlib.metadata import version

import pytest

from tests.support.venv import clean_env

pytestmark = pytest.mark.timeout(300)


def demo(venv, *args: str, cwd=None, timeout: float = 240, **env: str):
    return venv.run(
        "-m", "reloadpg_autopatch", "demo", *args, env=clean_env(**env), timeout=timeout, cwd=cwd
    )


def test_default_demo_prints_a_line_per_cycle_and_a_verdict(installed, tmp_path) -> None:
    """Over 10 s: the README's ``make demo`` as it is, four fresh ranks with megatron-core."""
    proc = demo(installed, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("reloadpg_autopatch demo: 4 ranks on gloo, 3 cycles")
    assert f"Megatron's groups (megatron-core {version('megatron-core')}, TP=2)" in lines[1]
    assert "patched at start-up by the .pth on every rank" in lines[1]
    cycle = re.compile(
        r"cycle (\d)/3: groups (\d+), destroy [\d.]+ ms, reload [\d.]+ ms, "
        r"collectives checked (\d+), bindings patched (\d+)/\4$"
    )
    # Each cycle's line, then rank 0's cycle report for it.
    matches = [cycle.match(line) for line in lines[2:8:2]]
    assert all(matches), lines
    assert [int(m.group(1)) for m in matches] == [1, 2, 3]
    reports = lines[3:8:2]
    for number, line in enumerate(reports, 1):
        assert line.startswith(f"  report, rank 0: cycle {number}: destroy "), lines
        assert re.search(r"reload [\d.]+ ms \(agreement [\d.]+", line), line
        assert f"{matches[0].group(2)} rebuilt" in line, line
    assert lines[8].startswith("verdict: OK - 4 ranks destroyed and reloaded")


def test_json_report_and_plain_torch_groups_without_megatron(installed, tmp_path) -> None:
    # A package that shadows megatron and fails to import: the ranks fall back to torch groups.
    (tmp_path / "megatron").mkdir()
    (tmp_path / "megatron" / "__init__.py").write_text("raise ImportError('hidden for the test')\n")
    proc = demo(
        installed,
        "--world-size",
        "2",
        "--cycles",
        "1",
        "--json",
        cwd=tmp_path,
        PYTHONPATH=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    assert report["megatron_core"] is None
    assert report["setup"]["bindings"] == {"found": 0, "patched": 0}
    assert len(report["cycles"]) == 1
    assert report["cycles"][0]["groups"] == report["setup"]["groups"] >= 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--world-size", "0"), "--world-size must be at least 1"),
        (("--cycles", "-1"), "--cycles must be 0 or more"),
        (("--port", "70000"), "--port must be 0"),
        (("--world-size", "two"), "invalid int value"),
        (("--framework", "slime", "--backend", "nccl"), "--framework runs on CPU"),
        (("--framework", "miles"), "invalid choice: 'miles'"),
    ],
)
def test_bad_arguments_are_usage_errors(installed, args, message) -> None:
    proc = demo(installed, *args)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_framework_demo_runs_an_unmodified_slime_shaped_actor_in_suspend_mode(
    installed, tmp_path
) -> None:
    """Over 10 s: two demos of two fresh ranks each (the JSON report, then the lines).

    ``demo --framework slime``: two fresh ranks with the gate (start-up is what adopts the
    actor's lifecycle module, named in the variable) run two steps of the slime-shaped actor in
    suspend mode, by default, on CPU. Each rank checks its backends' own counts (each suspended
    and resumed twice a step, none created again) and raises otherwise; the report says the
    module was adopted, the package counted every cycle, and the actor's class held nothing."""
    proc = demo(installed, "--framework", "slime", "--world-size", "2", "--cycles", "2", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True, report
    assert report["mode"] == "suspend"
    assert report["setup"]["adoption"] == {
        "adopted": [
            "monkey_patch_torch_dist",
            "register_default_process_group",
            "destroy_process_groups",
            "reload_process_groups",
        ],
        "kept": None,
    }
    for number, step in enumerate(report["steps"], start=1):
        assert step["step"] == number
        assert step["trained"] == [6.0, 6.0]  # 1 + 2 over both ranks, then over the pair
        assert step["weights"] == 100.0
        assert step["suspended"] == 3  # WORLD, the pair, data parallel
        assert step["created"] == 0
        assert step["their_groups"] == 0
        assert step["cycles"] == 1 + 2 * number  # init's sleep, then two per step
    text = demo(installed, "--framework", "slime", "--world-size", "2", "--cycles", "1")
    assert text.returncode == 0, text.stdout + text.stderr
    lines = text.stdout.splitlines()
    assert "adopted: monkey_patch_torch_dist, register_default_process_group" in lines[1]
    assert lines[2].startswith("step 1/1: train and update_weights (2 destroy/reload pairs)")
    assert lines[-1].startswith("verdict: OK - 2 ranks ran 1 step")
    assert "suspend mode" in lines[-1]


def test_a_taken_port_is_reported_as_such(installed) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = demo(installed, "--world-size", "2", "--port", str(port))
    assert proc.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in proc.stderr


def test_a_dying_rank_stops_the_demo_and_is_named(installed, tmp_path) -> None:
    """Over 10 s on a loaded machine: three fresh ranks with megatron-core start before one dies."""
    started = time.monotonic()
    proc = demo(
        installed,
        "--world-size",
        "3",
        "--cycles",
        "2",
        "--inject-failure",
        "1",
        "--timeout",
        "90",
        cwd=tmp_path,
    )
    assert proc.returncode == 1
    assert "verdict: FAILED - rank 1 failed (exit code 1)" in proc.stdout
    assert time.monotonic() - started < 90  # the survivors were stopped, not waited for


# In a rank (the launcher has no --rank), leave a mark and exit before anything is imported:
# should a bound be missing, the ranks it starts cost a bare interpreter start each, no more.
_EXIT_AT_START = (
    "import os, sys\n"
    "if '--rank' in sys.argv:\n"
    "    open(os.path.join({marks!r}, sys.argv[sys.argv.index('--rank') + 1]), 'w').close()\n"
    "    os._exit(0)\n"
)


def test_world_size_is_bounded_by_a_usage_error_naming_the_limit(installed, tmp_path) -> None:
    marks = tmp_path / "started"
    marks.mkdir()
    (tmp_path / "sitecustomize.py").write_text(_EXIT_AT_START.format(marks=str(marks)))
    started = time.monotonic()
    proc = demo(installed, "--world-size", "100000", timeout=60, PYTHONPATH=str(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("usage: ")  # argparse's form: usage, then one error line
    match = re.search(r"--world-size must be at most (\d+)", proc.stderr)
    assert match, proc.stderr
    limit = int(match.group(1))
    assert 1 < limit < 100000
    assert time.monotonic() - started < 30
    assert list(marks.iterdir()) == []  # refused before a single rank was started
    over = demo(installed, "--world-size", str(limit + 1), timeout=60, PYTHONPATH=str(tmp_path))
    assert over.returncode == 2
    assert f"at most {limit}" in over.stderr
    assert list(marks.iterdir()) == []


# Makes the interpreter of one rank hang before the rank program even runs, as a rank whose
# machine is overloaded or whose start-up blocks would: only the launcher's clock can stop it.
_HANG_AT_START = (
    "import sys, time\n"
    "if '--rank' in sys.argv and sys.argv[sys.argv.index('--rank') + 1] == '{rank}':\n"
    "    time.sleep(120)\n"
)


@pytest.mark.timeout(120)
def test_a_rank_that_does_not_come_up_fails_within_the_timeout_and_is_named(
    installed, tmp_path
) -> None:
    """Over 10 s: it waits out the demo's ``--timeout``, which must let rank 0 import torch and
    megatron-core and come up on a loaded machine."""
    (tmp_path / "sitecustomize.py").write_text(_HANG_AT_START.replace("{rank}", "1"))
    timeout = 15
    started = time.monotonic()
    proc = demo(
        installed,
        "--world-size",
        "2",
        "--cycles",
        "1",
        "--timeout",
        str(timeout),
        cwd=tmp_path,
        timeout=90,
        PYTHONPATH=str(tmp_path),
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdict = next(line for line in proc.stdout.splitlines() if line.startswith("verdict:"))
    assert re.search(rf"\brank 1 did not come up within {timeout} s\b", verdict), verdict
    assert "ranks" not in verdict  # rank 0 came up: only the rank that did not is named
    assert elapsed < timeout + 30  # the launcher's own start-up and the stop, not a second wait


# Each rank's interpreter aborts as its exit tears down (as gloo's threads can, "terminate
# called without an active exception"): a failed rank must end before that, with exit code 1.
_ABORT_AT_RANK_EXIT = (
    "import atexit, os, signal, sys\n"
    "if '--rank' in sys.argv:\n"
    "    atexit.register(lambda: os.kill(os.getpid(), signal.SIGABRT))\n"
)


def test_an_injected_failure_is_reported_as_the_ranks_exception(installed, tmp_path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_ABORT_AT_RANK_EXIT)
    proc = demo(
        installed,
        *("--world-size", "2", "--cycles", "1", "--inject-failure", "1"),
        cwd=tmp_path,
        PYTHONPATH=str(site),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdict = re.search(r"verdict: FAILED - rank 1 failed \(exit code 1\): (.*)", proc.stdout)
    assert verdict, proc.stdout
    reason = verdict.group(1)
    tail = proc.stdout.split("--- rank 1 stderr (last lines) ---\n", 1)[1].splitlines()
    # The reason is the exception the rank raised: the last line of its own traceback (torch
    # prefixes a rank's stderr lines with "[rankN]: ").
    assert any(re.search(r'File ".*", line \d+, in ', line) for line in tail[:-1]), proc.stdout
    assert re.sub(r"^\[rank\d+\]: ", "", tail[-1]) == reason, proc.stdout
    assert re.match(r"[A-Za-z_][\w.]*(Error|Exception|Failure): ", reason), reason
    assert "inject" in reason.lower()
    assert "Warning" not in reason


@pytest.mark.timeout(60)
def test_the_timeout_also_covers_starting_the_ranks(monkeypatch) -> None:
    import subprocess
    import sys

    from reloadpg_autopatch.tools import launch

    real_popen = subprocess.Popen
    started_ranks = []

    def slow_popen(argv, **kwargs):  # a machine where every interpreter takes 2 s to start
        if "--rank" not in argv:  # not a rank: torch's CUDA build runs ldconfig at import
            return real_popen(argv, **kwargs)
        time.sleep(2)
        started_ranks.append(argv[argv.index("--rank") + 1])
        return real_popen(argv, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", slow_popen)
    command = [sys.executable, "-c", "import time; time.sleep(60)"]
    timeout = 3
    started = time.monotonic()
    with pytest.raises(launch.LaunchError) as failure:
        launch.launch(command, 8, timeout=timeout)
    elapsed = time.monotonic() - started
    assert elapsed < timeout + 5, elapsed  # not 8 x 2 s of starting, then the timeout again
    never_started = [str(rank) for rank in range(8) if str(rank) not in started_ranks]
    assert never_started
    message = str(failure.value)
    assert f"did not come up within {timeout} s" in message, message
    assert all(re.search(rf"\b{rank}\b", message) for rank in never_started), message
