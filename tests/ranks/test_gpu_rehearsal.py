"""``scripts/gpu_smoke.py --rehearse``: the GPU run's steps on CPU, so the script cannot rot.

A GPU is lent by chance, for minutes; the script must give data on its first run there. These
tests run its rehearsal (gloo and the suspendable stand-in in NCCL's place, the same steps,
deadlines and JSON) and read ``smoke.json`` against a schema written here, independent of the
script: the keys a reader relies on, their types, and the status values. Each run is the script
as a user starts it (a subprocess of this interpreter, which must have the package installed
so that its ``.pth`` activates the ranks), under a timeout, so that a hang fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_smoke.py"
STEPS = [
    "preflight",
    "nccl_suspend",
    "wrapper_demo",
    "wrapper_checks",
    "package_suspend",
    "native_nccl2",
    "suspend_probes",
]
STEP_STATUSES = {"running", "ok", "failed", "skipped", "timeout", "crashed", "interrupted"}
RUN_OUTCOMES = {"running", "ok", "failed", "timeout", "crashed", "interrupted"}
CHECK_STATUSES = {"ok", "failed", "skipped"}
MAYBE = (True, False, None)
TOP_STATUSES = {"running", "done", "no-device", "interrupted"}
EIGHT_MINUTES = 480.0

# ---- the schema -------------------------------------------------------------------------------

NUMBER = (int, float)
OPTIONAL_NUMBER = (int, float, type(None))
OPTIONAL_STR = (str, type(None))
TOP = {
    "schema": int,
    "script": str,
    "mode": str,
    "status": str,
    "exit_code": (int, type(None)),
    "reason": OPTIONAL_STR,
    "started": str,
    "updated": str,
    "elapsed_s": NUMBER,
    "budget_s": NUMBER,
    "worst_case": dict,
    "preflight": (dict, type(None)),
    "plan": list,
    "steps": list,
    "warnings": list,
    "failures": list,
    "deadline_scale": NUMBER,
}
STEP = {
    "name": str,
    "title": str,
    "status": str,
    "reason": OPTIONAL_STR,
    "worst_case_s": OPTIONAL_NUMBER,
    "started_s": OPTIONAL_NUMBER,
    "wall_s": OPTIONAL_NUMBER,
    "runs": list,
    "summary": dict,
    "failures": list,
}
RUN = {
    "label": str,
    "program": str,
    "world_size": int,
    "env": dict,
    "deadline_s": NUMBER,
    "memory_before": dict,
    "outcome": str,
    "pids": list,
    "wall_s": OPTIONAL_NUMBER,
    "ranks": list,
    "failures": list,
}
RANK = {
    "rank": int,
    "exit_code": (int, type(None)),
    "data": dict,
    "checks": list,
    "events": list,
    "stderr_tail": list,
}
CHECK = {"name": str, "status": str, "detail": str}
PREFLIGHT = {
    "python": str,
    "package": dict,
    "torch": dict,
    "capabilities": dict,
    "nccl": dict,
    "implementation": dict,
    "cuda": dict,
    "megatron": dict,
}
CAPABILITIES = ("backend_suspend", "reconfigure", "pre_hooks", "comm_ptr")


def _keys(where: str, obj: Any, spec: dict[str, Any]) -> list[str]:
    if not isinstance(obj, dict):
        return [f"{where}: not an object ({type(obj).__name__})"]
    problems = []
    for key, kinds in spec.items():
        if key not in obj:
            problems.append(f"{where}: no {key!r}")
        elif isinstance(obj[key], bool) and bool not in (
            kinds if isinstance(kinds, tuple) else (kinds,)
        ):
            problems.append(f"{where}.{key}: a bool, want {kinds}")
        elif not isinstance(obj[key], kinds):
            problems.append(f"{where}.{key}: {type(obj[key]).__name__}, want {kinds}")
    return problems


def schema_problems(data: Any) -> list[str]:
    """Everything in ``data`` that is not what ``smoke.json`` promises (empty: it conforms)."""
    problems = _keys("top", data, TOP)
    if problems:
        return problems
    if data["schema"] != 1:
        problems.append(f"schema {data['schema']}, want 1")
    if data["status"] not in TOP_STATUSES:
        problems.append(f"top status {data['status']!r}")
    if data["mode"] not in ("gpu", "rehearsal"):
        problems.append(f"mode {data['mode']!r}")
    if data["plan"] != STEPS:
        problems.append(f"plan {data['plan']}, want {STEPS}")
    if data["preflight"] is not None:
        problems += _keys("preflight", data["preflight"], PREFLIGHT)
        capabilities = data["preflight"].get("capabilities") or {}
        for key in CAPABILITIES:
            if not isinstance(capabilities.get(key), bool):
                problems.append(f"preflight.capabilities.{key}: {capabilities.get(key)!r}")
        if not isinstance((data["preflight"].get("package") or {}).get("activated"), bool):
            problems.append("preflight.package.activated is not a bool")
    names = [s.get("name") for s in data["steps"] if isinstance(s, dict)]
    if names != STEPS[: len(names)]:
        problems.append(f"steps {names} are not the plan's first {len(names)}")
    for step in data["steps"]:
        where = f"step {step.get('name')}"
        problems += _keys(where, step, STEP)
        status = step.get("status")
        if status not in STEP_STATUSES:
            problems.append(f"{where}: status {status!r}")
        if status == "skipped" and not str(step.get("reason", "")).startswith("skipped: "):
            problems.append(f"{where}: skipped without 'skipped: <why>' ({step.get('reason')!r})")
        if status in ("failed", "timeout", "crashed") and not step.get("reason"):
            problems.append(f"{where}: {status} without a reason")
        for run in step.get("runs") or []:
            run_where = f"{where} / run {run.get('label')}"
            problems += _keys(run_where, run, RUN)
            if run.get("outcome") not in RUN_OUTCOMES:
                problems.append(f"{run_where}: outcome {run.get('outcome')!r}")
            memory = run.get("memory_before") or {}
            if not isinstance(memory.get("source"), str) or memory.get("ok") not in MAYBE:
                problems.append(f"{run_where}: the GPU check before it is missing: {memory}")
            for rank in run.get("ranks") or []:
                rank_where = f"{run_where} / rank {rank.get('rank')}"
                problems += _keys(rank_where, rank, RANK)
                for check in rank.get("checks") or []:
                    problems += _keys(f"{rank_where} / check", check, CHECK)
                    if check.get("status") not in CHECK_STATUSES:
                        problems.append(f"{rank_where}: check status {check.get('status')!r}")
    return problems


# ---- running the script -----------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLIME_RELOADABLE_PG")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _smoke(
    out: Path, *options: str, timeout: float = 150.0, **env: str
) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *options],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**_env(), **env},
        cwd=str(ROOT),
        check=False,
    )
    data = json.loads((out / "smoke.json").read_text(encoding="utf-8"))
    return done.returncode, data, done.stdout + done.stderr


def _torch_can(what: str) -> bool:
    import torch
    import torch.distributed as dist

    if what == "suspend":
        backend = torch._C._distributed_c10d.Backend
        return all(hasattr(backend, n) for n in ("suspend", "resume", "memory_stats"))
    if what == "python_backend":  # a Python-constructible Backend: the stand-in's variant B
        try:
            torch._C._distributed_c10d.Backend(0, 1)
        except TypeError:
            return False
        return True
    return hasattr(dist.ProcessGroup, "reconfigure")


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], str]:
    """One whole rehearsal, read by several tests (it is the slow part: about 20-30 s)."""
    return _smoke(tmp_path_factory.mktemp("rehearsal"), "--rehearse")


def test_the_rehearsal_passes_and_its_json_keeps_the_schema(rehearsal) -> None:
    """The whole rehearsal exits 0 and ``smoke.json`` conforms: every step of the plan is there,
    in order, each ``ok`` or ``skipped`` with a reason, and every check ``ok`` or ``skipped``.

    Slow by nature (about 20-30 s on two cores): it starts some twelve interpreters that import
    torch, one of them megatron-core too, which is what the GPU run does. The other tests here
    read the same run.
    """
    code, data, output = rehearsal
    assert schema_problems(data) == [], output[-3000:]
    assert code == 0, output[-3000:]
    assert data["status"] == "done"
    assert data["exit_code"] == 0
    assert data["mode"] == "rehearsal"
    assert [s["name"] for s in data["steps"]] == STEPS
    assert data["failures"] == []
    for step in data["steps"]:
        assert step["status"] in ("ok", "skipped"), (step["name"], step["reason"])
        for run in step["runs"]:
            for rank in run["ranks"]:
                assert rank["exit_code"] == 0, (step["name"], run["label"], rank["stderr_tail"])
                assert rank["checks"], (step["name"], run["label"], "no check was recorded")


def test_the_rehearsal_runs_every_step_this_torch_allows(rehearsal) -> None:
    """What may be skipped on CPU is exactly what this torch cannot do, and the reason says
    so: the package's suspend mode needs ``Backend.suspend``; nccl2 in place needs
    ``ProcessGroup.reconfigure``. Everything else runs."""
    _code, data, _output = rehearsal
    status = {s["name"]: s for s in data["steps"]}
    must = {"preflight", "nccl_suspend", "wrapper_demo", "wrapper_checks", "suspend_probes"}
    if _torch_can("suspend"):
        must.add("package_suspend")
    else:
        assert "Backend.suspend" in status["package_suspend"]["reason"]
    if _torch_can("reconfigure"):
        must.add("native_nccl2")
    else:
        assert "reconfigure" in status["native_nccl2"]["reason"]
    for name in must:
        assert status[name]["status"] == "ok", (name, status[name]["reason"])
    assert data["preflight"]["package"]["activated"] is True


def test_the_suspend_and_in_place_passes_run_on_both_implementations(rehearsal) -> None:
    """Where they run, the suspend and in-place steps have a run on ``nccl`` and one on
    ``nccl-legacy``, and every rank of each records the implementation it got and what it
    asked for; the rehearsal's classic stand-in (torch 2.14: one that cannot reconfigure)
    is refused in native mode, as the classic backend is."""
    _code, data, _output = rehearsal
    ran = [s for s in data["steps"] if s["name"] in ("package_suspend", "native_nccl2")]
    for step in (s for s in ran if s["status"] == "ok"):
        labels = [run["label"] for run in step["runs"]]
        assert [label.rsplit(" on ", 1)[-1] for label in labels] == ["nccl", "nccl-legacy"]
        for run in step["runs"]:
            asked = run["label"].rsplit(" on ", 1)[-1]
            for rank in run["ranks"]:
                found = rank["data"].get("implementation") or {}
                assert found.get("asked") == asked, (run["label"], found)
                assert isinstance(found.get("class"), str), (run["label"], found)
    native = {s["name"]: s for s in ran}.get("native_nccl2")
    if native is not None and native["status"] == "ok" and _torch_can("python_backend"):
        legacy = native["runs"][1]["ranks"][0]["checks"]
        assert any(c["name"].startswith("in place refused") for c in legacy), legacy


def test_the_preflight_finds_what_the_gpu_run_decides_on(rehearsal) -> None:
    """The preflight's answers match this interpreter's torch, asked independently here."""
    import torch
    import torch.distributed as dist

    _code, data, _output = rehearsal
    pre = data["preflight"]
    assert pre["torch"]["version"] == torch.__version__
    assert pre["capabilities"]["backend_suspend"] is _torch_can("suspend")
    assert pre["capabilities"]["reconfigure"] is _torch_can("reconfigure")
    assert pre["cuda"]["available"] is torch.cuda.is_available()
    nccl2 = False
    ensure = getattr(dist.Backend, "_ensure_backend_registered", None)
    if ensure is not None:  # torch 2.14 registers nccl2 lazily, from an entry point
        ensure("nccl2")
        nccl2 = "NCCL2" in dist.Backend._plugins
    assert pre["implementation"]["nccl2_available"] is nccl2
    library = pre["nccl"]["library"]
    if torch.version.cuda is None:
        assert library["version"] is None, library
    else:  # a CUDA build loads its libnccl even without a GPU; ask it through torch
        want = torch.cuda.nccl.version()
        assert tuple(library["version"]) == tuple(want), library


def test_a_run_cut_midway_keeps_the_steps_so_far(tmp_path: Path) -> None:
    """Killed (SIGKILL to its process group, as a time limit does) while the second step's
    ranks run: ``smoke.json`` still parses, holds the finished preflight and what the running
    step's ranks reported so far, and names those ranks, which die with the script. They are
    held in the stand-in's suspend, silent, so they would never end by themselves, and they run
    in sessions of their own, so the kill does not reach them: only their watch on the script
    ends them."""
    out = tmp_path / "cut"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--out", str(out), "--rehearse"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**_env(), "SUSPENDABLE_HANG": "suspend"},
        cwd=str(ROOT),
        start_new_session=True,
    )
    path = out / "smoke.json"
    try:
        _wait_for_held_ranks(path, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert schema_problems(data) == []
    assert data["status"] == "running"
    first = data["steps"][0]
    assert first["name"] == "preflight"
    assert first["status"] == "ok"
    assert data["preflight"]["torch"]["version"]
    running = [s for s in data["steps"] if s["status"] == "running"]
    assert len(running) == 1, [(s["name"], s["status"]) for s in data["steps"]]
    assert running[0] is data["steps"][-1]
    cut = running[0]["runs"][-1]
    assert cut["outcome"] == "running"
    assert len(cut["ranks"]) == cut["world_size"]
    assert all(r["data"]["stats_awake"] for r in cut["ranks"])
    pids = running[0]["runs"][-1]["pids"]
    assert pids
    gone_by = time.monotonic() + 10
    alive = list(pids)
    while alive and time.monotonic() < gone_by:
        alive = [pid for pid in pids if _alive(pid)]
        time.sleep(0.1)
    assert alive == [], f"ranks {alive} outlived the script that started them"


def test_sigterm_stops_the_ranks_and_says_so_in_json(tmp_path: Path) -> None:
    """SIGTERM (what ``timeout`` sends) while ranks run: the script kills them, records the
    step and the run as ``interrupted`` with what the ranks reported, and exits 130."""
    out = tmp_path / "term"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--out", str(out), "--rehearse"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**_env(), "SUSPENDABLE_HANG": "suspend"},
        cwd=str(ROOT),
        start_new_session=True,
    )
    try:
        _wait_for_held_ranks(out / "smoke.json", proc)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    data = json.loads((out / "smoke.json").read_text(encoding="utf-8"))
    assert schema_problems(data) == []
    assert code == 130
    assert data["status"] == "interrupted"
    assert data["exit_code"] == 130
    step = data["steps"][-1]
    assert step["status"] == "interrupted", step
    run = step["runs"][-1]
    assert run["outcome"] == "interrupted"
    assert len(run["ranks"]) == run["world_size"]
    assert all(r["data"]["stats_awake"] for r in run["ranks"])
    assert [pid for pid in run["pids"] if _alive(pid)] == []


def _wait_for_held_ranks(path: Path, proc: subprocess.Popen, limit: float = 60.0) -> None:
    """Until the second step's ranks have all reported, then entered the held suspend."""
    deadline = time.monotonic() + limit
    data: dict[str, Any] = {}
    while time.monotonic() < deadline:
        if path.exists():
            data = json.loads(path.read_text(encoding="utf-8"))
            steps = data["steps"]
            ranks = steps[1]["runs"][-1]["ranks"] if len(steps) > 1 and steps[1]["runs"] else []
            if ranks and all("stats_awake" in r["data"] for r in ranks):
                return
        assert proc.poll() is None, "the rehearsal ended before the ranks were held"
        time.sleep(0.05)
    pytest.fail(f"the second step's ranks did not report within {limit:g} s: {data}")


def test_ranks_past_their_deadline_are_killed_with_their_groups(tmp_path: Path) -> None:
    """Two ranks that never finish (the stand-in holds rank 1's suspend, so rank 0 waits in
    the barrier) are stopped at the run's deadline: the run says ``timeout`` and which ranks
    were still running, keeps what they reported before, and leaves no process behind.

    The deadlines are scaled down (``GPU_SMOKE_DEADLINE_SCALE=0.15``, recorded in the JSON)
    and only this step runs (``--steps``), so this takes about 10 s instead of a minute.
    """
    code, data, output = _smoke(
        tmp_path / "deadline",
        "--rehearse",
        "--steps",
        "nccl_suspend",
        SUSPENDABLE_HANG="suspend@1",
        GPU_SMOKE_DEADLINE_SCALE="0.15",
    )
    assert schema_problems(data) == [], output[-2000:]
    assert code == 1, output[-2000:]
    assert data["deadline_scale"] == 0.15
    step = data["steps"][1]
    assert step["name"] == "nccl_suspend"
    assert step["status"] == "timeout", step["reason"]
    run = step["runs"][-1]
    assert run["world_size"] == 2
    assert run["outcome"] == "timeout"
    assert run["deadline_s"] == pytest.approx(45 * 0.15)
    assert run["deadline_s"] <= run["wall_s"] <= run["deadline_s"] + 4
    assert run["stopped_ranks"] == [0, 1]
    assert "stopped at its deadline" in step["reason"], step["reason"]
    assert len(run["ranks"]) == 2
    for rank in run["ranks"]:
        assert rank["data"]["stats_awake"], rank  # what it said before it hung is kept
    assert run["leftover_groups"] == []
    assert [pid for pid in run["pids"] if _alive(pid)] == []
    for later in data["steps"][2:]:
        assert later["status"] == "skipped", later["name"]
        assert later["reason"] == "skipped: not selected (--steps)", later["reason"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    with_state = status.read_text().rsplit(")", 1)[-1].split() if status.exists() else ["X"]
    return with_state[0] not in ("Z", "X")  # a zombie waits for its reaper, it does not run


def test_the_budget_starts_only_steps_that_fit(tmp_path: Path) -> None:
    """``--budget 56``: after the preflight, a step starts only if its worst case fits in what
    is left of the budget when its turn comes; every other step is skipped saying so, and
    nothing is started for it. ``wrapper_checks`` (48 s) fits, ``nccl_suspend`` (91 s) does
    not; what else fits depends on what this torch can run (on 2.11 the probes shrink to one
    run)."""
    budget = 56.0
    code, data, output = _smoke(tmp_path / "budget", "--rehearse", "--budget", str(budget))
    assert schema_problems(data) == [], output[-2000:]
    assert code == 0, output[-2000:]
    assert data["steps"][0]["status"] == "ok"
    needs = {"package_suspend": _torch_can("suspend"), "native_nccl2": _torch_can("reconfigure")}
    ran, over = [], []
    for step in data["steps"][1:]:
        fits = step["started_s"] + step["worst_case_s"] <= budget
        if step["status"] == "ok":
            assert fits, step
            ran.append(step["name"])
        elif needs.get(step["name"], True):
            assert step["status"] == "skipped", step["name"]
            assert not fits, step
            assert step["reason"].startswith("skipped: budget: needs up to "), step["reason"]
            assert step["runs"] == []
            over.append(step["name"])
    assert "wrapper_checks" in ran, [(s["name"], s["reason"]) for s in data["steps"]]
    assert "nccl_suspend" in over, [(s["name"], s["reason"]) for s in data["steps"]]


def test_without_a_gpu_it_says_so_in_json_and_exits_2(tmp_path: Path) -> None:
    """No GPU and no ``--rehearse``: exit 2, and the JSON is still written, saying why."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    code, data, output = _smoke(tmp_path / "cpu")
    assert schema_problems(data) == [], output[-2000:]
    assert code == 2, output[-2000:]
    assert data["status"] == "no-device"
    assert data["exit_code"] == 2
    assert data["reason"].startswith("no CUDA device"), data["reason"]
    assert data["steps"][0]["status"] == "ok"
    for step in data["steps"][1:]:
        assert step["status"] == "skipped", step["name"]
        assert "no CUDA device" in step["reason"]


def test_the_worst_case_fits_eight_minutes_and_the_docs_show_it() -> None:
    """``--plan``: the worst cases add up to at most 8 minutes, the default budget is that,
    and docs/demo.md's table gives the same seconds per step and the same total."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--plan"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    plan = json.loads(done.stdout)
    assert list(plan["steps"]) == STEPS
    assert plan["total_s"] == pytest.approx(sum(plan["steps"].values()))
    assert plan["total_s"] <= EIGHT_MINUTES
    assert plan["budget_s"] <= EIGHT_MINUTES
    docs = (ROOT / "docs" / "demo.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \|[^|]*\| (\d+) s \|", docs, flags=re.MULTILINE))
    assert rows == {name: str(round(s)) for name, s in plan["steps"].items()}, rows
    total = re.search(r"^\| \*\*total\*\* \|[^|]*\| \*\*(\d+) s\*\* \|", docs, re.MULTILINE)
    assert total is not None
    assert int(total.group(1)) == round(plan["total_s"])


def _script_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_smoke_under_test", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("nccl_means", "want"),
    [("classic", {"TORCH_DIST_USE_NCCL2": "1"}), ("nccl2", {})],
    ids=["torch-2.14", "torch-2.15"],
)
def test_the_nccl_pass_makes_nccl_mean_nccl2_where_torch_does_not(nccl_means, want) -> None:
    """On a GPU, the pass "on nccl" tests nccl2: where this torch's ``nccl`` is the classic
    backend and nccl2 is there (2.14), its ranks get ``TORCH_DIST_USE_NCCL2=1``; where ``nccl``
    already means nccl2 (2.15), nothing; the ``nccl-legacy`` pass never. A plan from a made-up
    preflight, no rank started."""
    smoke = _script_module()
    pre = {
        "implementation": {
            "nccl": nccl_means,
            "nccl2_available": True,
            "nccl_legacy_available": True,
        }
    }
    runs = smoke._passes(
        smoke.Facts(pre, rehearse=False), "pass", "prog.py", 2, env={}, deadlines=(1.0, 1.0)
    )
    by_backend = {run.options[1]: run.env for run in runs}
    assert set(by_backend) == {"nccl", "nccl-legacy"}, by_backend
    assert by_backend["nccl"] == want
    assert "TORCH_DIST_USE_NCCL2" not in by_backend["nccl-legacy"]
