"""What keeps the suite fast and CI honest: folders and markers, the slowest tests printed, the
session fixtures, the Makefile's targets, and ``.ci/run``'s two streams (run with a stand-in
``make`` that only logs, so this takes a second, not an hour)."""

from __future__ import annotations

import ast
import configparser
import os
import subprocess
from pathlib import Path

from tests import conftest
from tests.support import ROOT


def test_every_kind_of_test_has_its_folder_and_its_marker() -> None:
    folders = {
        p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and any(p.glob("test_*.py"))
    }
    assert folders == set(conftest.KINDS)
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    markers = config["tool:pytest"]["markers"]
    for kind in conftest.KINDS:
        assert f"\n{kind}:" in "\n" + markers.strip(), kind


def test_every_pytest_run_prints_its_fifteen_slowest_tests() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    assert "--durations=15" in config["tool:pytest"]["addopts"].split()


def test_wheels_and_venvs_are_built_once_per_session() -> None:
    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text(encoding="utf-8"))
    scopes = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                if (
                    isinstance(decorator, ast.Call)
                    and ast.unparse(decorator.func) == "pytest.fixture"
                ):
                    scopes[node.name] = {
                        k.arg: ast.literal_eval(k.value) for k in decorator.keywords
                    }
    for name in ("built", "installed", "installed_without_torch"):
        assert scopes[name].get("scope") == "session", name


def test_each_make_target_runs_one_folder() -> None:
    for kind in conftest.KINDS:
        dry = subprocess.run(
            ["make", "-n", f"test-{kind}", "VENV=/nonexistent-venv"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert f"-m pytest tests/{kind}\n" in dry.stdout, dry.stdout


STUB_MAKE = """#!/usr/bin/env bash
printf '%s %s start %s\\n' "$TMPDIR" "$*" "$(date +%s.%N)" >> "$CI_STUB_LOG"
sleep 0.3
printf '%s %s end %s\\n' "$TMPDIR" "$*" "$(date +%s.%N)" >> "$CI_STUB_LOG"
case "$*" in *lint*) exit 3 ;; esac
"""


def test_ci_runs_every_step_in_two_streams_and_fails_for_one_failure(tmp_path: Path) -> None:
    """Every step runs even after one failed; the 2.14.1 lane runs beside the others, each
    stream with a temporary folder of its own; the summary names the failure, and the run
    fails."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "make").write_text(STUB_MAKE)
    (stub / "make").chmod(0o755)
    log = tmp_path / "make.log"
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "CI_STUB_LOG": str(log)}
    proc = subprocess.run(
        ["bash", str(ROOT / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0, proc.stdout
    lines = [line.split() for line in log.read_text().splitlines()]
    steps = {" ".join(line[1:-2]) for line in lines}
    assert steps == {
        "test",
        "lint",
        "test TORCH_SPEC=torch==2.14.1 PYTHON=python3.12",
        "test-startup PYTHON=python3.10",
        "test-startup PYTHON=python3.12",
        "test-startup PYTHON=python3.13",
    }
    background = [line for line in lines if "TORCH_SPEC=torch==2.14.1" in line]
    foreground = [line for line in lines if "TORCH_SPEC=torch==2.14.1" not in line]
    assert len({line[0] for line in background}) == 1
    assert len({line[0] for line in foreground}) == 1
    assert background[0][0] != foreground[0][0]  # a temporary folder each
    bg_start = float(next(line[-1] for line in background if line[-2] == "start"))
    fg_end = max(float(line[-1]) for line in foreground if line[-2] == "end")
    assert bg_start < fg_end  # the two streams overlap
    assert "1 of 6 steps failed" in proc.stdout, proc.stdout
    assert "lint (ruff check, ruff format --check)" in proc.stdout


JUNIT_STUB_MAKE = """#!/usr/bin/env bash
printf '%s|%s\\n' "$*" "${PYTEST_ADDOPTS:-}" >> "$CI_STUB_LOG"
"""


def test_ci_writes_one_junit_report_per_step_when_asked(tmp_path: Path) -> None:
    """``CI_JUNIT_DIR`` gives each step's pytest a JUnit report of its own (the per-lane
    figures of benchmarks/results/ci-time.md come from them); unset, pytest gets no option."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "make").write_text(JUNIT_STUB_MAKE)
    (stub / "make").chmod(0o755)
    for junit in (tmp_path / "junit", None):
        log = tmp_path / f"make-{junit is None}.log"
        env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "CI_STUB_LOG": str(log)}
        env.pop("PYTEST_ADDOPTS", None)  # this very run's may carry a report of its own
        env.pop("CI_JUNIT_DIR", None)
        if junit is not None:
            env["CI_JUNIT_DIR"] = str(junit)
        proc = subprocess.run(
            ["bash", str(ROOT / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        options = dict(line.split("|", 1) for line in log.read_text().splitlines())
        assert len(options) == 6, options
        if junit is None:
            assert set(options.values()) == {""}, options
            continue
        paths = {args: opts.removeprefix("--junitxml=") for args, opts in options.items()}
        assert all(Path(p).parent == junit for p in paths.values()), paths
        assert len(set(paths.values())) == 6, paths
        assert paths["test"].endswith("torch-2.13.0-lane.xml"), paths


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">{}
</testsuite></testsuites>"""


def _junit(path: Path, cases: list[tuple[str, str, float]]) -> Path:
    rows = "".join(f'<testcase classname="{c}" name="{n}" time="{t}"/>' for c, n, t in cases)
    path.write_text(JUNIT.format(rows), encoding="utf-8")
    return path


def test_ci_time_lines_each_file_up_with_the_run_before(tmp_path: Path) -> None:
    """``benchmarks.ci_time``: a lane's total, its slowest tests first, and each file's
    seconds beside the earlier run's, matched by file name (a file that moved folders lines
    up; one only in either run shows 0 on the other side)."""
    from benchmarks import ci_time

    after = _junit(
        tmp_path / "after.xml",
        [
            ("tests.ranks.test_a", "t1", 2.0),
            ("tests.ranks.test_a", "t2", 3.0),
            ("tests.unit.test_new", "t", 1.0),
        ],
    )
    before = _junit(
        tmp_path / "before.xml",
        [("tests.test_a", "t1", 7.0), ("tests.test_a", "t2", 4.0), ("tests.test_gone", "t", 9.0)],
    )
    text = ci_time.report(after, before, slowest=2)
    assert text.startswith("total: 6 s over 3 tests"), text
    lines = text.splitlines()
    slowest = [line for line in lines if line.startswith("| `test_a::")]
    assert slowest == ["| `test_a::t2` | 3.0 |", "| `test_a::t1` | 2.0 |"], lines
    assert "| `test_a` | 5.0 | 11.0 |" in lines, text
    assert "| `test_gone` | 0.0 | 9.0 |" in lines, text
    assert "| `test_new` | 1.0 | 0.0 |" in lines, text
    assert "before" not in ci_time.report(after, None, slowest=2)
