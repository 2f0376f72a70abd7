"""``python -m reloadpg_autopatch demo``, run as the README says, from an installed package."""

from __future__ import annotations

import json
import re
import socket
import time
from importlib.metadata import version

import pytest

from tests._venv import clean_env

pytestmark = pytest.mark.timeout(300)


def demo(venv, *args: str, cwd=None, timeout: float = 240, **env: str):
    return venv.run(
        "-m", "reloadpg_autopatch", "demo", *args, env=clean_env(**env), timeout=timeout, cwd=cwd
    )


def test_default_demo_prints_a_line_per_cycle_and_a_verdict(installed, tmp_path) -> None:
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
    matches = [cycle.match(line) for line in lines[2:5]]
    assert all(matches), lines
    assert [int(m.group(1)) for m in matches] == [1, 2, 3]
    assert lines[5].startswith("verdict: OK - 4 ranks destroyed and reloaded")


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
    ],
)
def test_bad_arguments_are_usage_errors(installed, args, message) -> None:
    proc = demo(installed, *args)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_a_taken_port_is_reported_as_such(installed) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = demo(installed, "--world-size", "2", "--port", str(port))
    assert proc.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in proc.stderr


def test_a_dying_rank_stops_the_demo_and_is_named(installed, tmp_path) -> None:
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
    assert "verdict: FAILED - rank 1 failed (exit code 3)" in proc.stdout
    assert time.monotonic() - started < 90  # the survivors were stopped, not waited for
