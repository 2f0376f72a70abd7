"""GPU smoke run: every NCCL path of the package on one GPU, with data from the first run.

    python scripts/gpu_smoke.py --out DIR [--budget SECONDS] [--steps NAME,...] [--rehearse]
    python scripts/gpu_smoke.py --plan        # the worst-case time table, as JSON

Not part of the tests. An accelerator machine is lent by chance, for minutes, with whatever
torch its image holds (torch 2.11 with NCCL 2.28.9, last read), so this script is built to give
data on its first run there:

- A preflight (one fresh rank started with ``SLIME_RELOADABLE_PG=1`` alone) records torch,
  CUDA, the driver, NCCL as built and as loaded (``ncclGetVersion`` of the libnccl in the
  process), which implementation a plain ``nccl`` group gets, whether ``Backend.suspend``
  exists, whether nccl2 can be registered (torch 2.14 registers it from an entry point), and
  whether the package's ``.pth`` activated it. Each later step runs only where its needs are
  met, and records why not otherwise.
- Steps, by value: NCCL's own suspend and resume on torch's communicators (torch's API, or
  NCCL's C API through ctypes where torch is older than its NCCL), the demo's cycle in the
  wrapper mode on ``nccl``, the wrapper mode's checks (WORLD swapped and back, the memory
  guard, a CUDA memory pool across a reload, the cycle report against ``mem_get_info``), the
  package's suspend mode and in place, each on ``nccl`` and on ``nccl-legacy`` (each run
  records which implementation it got: torch 2.15's ``nccl`` is nccl2; on torch 2.14 the
  ``nccl`` pass sets ``TORCH_DIST_USE_NCCL2=1`` so that the two passes cover nccl2 and the
  classic backend there too), and the suspend probes (a raw collective on a suspended
  communicator last: it may fault the GPU).
- ``DIR/smoke.json`` is written as each step and each run starts and ends, and twice a second
  while ranks report (a temporary file, then a rename), so a run cut at its limit still
  returns its data, the running step's included. Every rank is a fresh
  interpreter in a process session of its own, killed as a group at its deadline (and by the
  kernel if this script dies); the GPU is checked free before each run. The deadlines add up
  to at most 8 minutes (``--plan``); ``--budget`` stops starting steps that might not fit.
- The rank programs live in ``gpu_smoke_ranks.py`` beside this file; each rank runs it.
- ``--rehearse`` runs the same steps on CPU, with gloo and the suspendable stand-in of
  ``tests/support/suspendable.py`` in NCCL's place, under the same deadlines and into the same JSON
  schema: CI runs it so that this script cannot rot between GPU draws.

Exit status: 0 every check held, 1 a check failed (``failures`` says which), 2 no CUDA device
(without ``--rehearse``; the JSON is still written), 130 interrupted.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = 1
SCRIPT = Path(__file__).resolve()
RANKS = SCRIPT.with_name("gpu_smoke_ranks.py")  # the program every rank runs
ROOT = SCRIPT.parent.parent
HOST = "127.0.0.1"
#: What the device machine allows one command is 10 minutes; the issue asks for 8.
BUDGET_S = 480.0
#: Per run, besides its deadline: the GPU check before it and reaping the ranks after it.
CHECK_S = 5.0
REAP_S = 3.0
#: The JSON takes in what the ranks of a running run said at most this often.
FLUSH_S = 0.5
#: A rank whose peer died is given this long to notice before it is killed too.
PEER_GRACE_S = 5.0
TAG = "@gpu_smoke "
DEMO_TAG = "@reloadpg_autopatch "  # what the package's demo rank emits (tools.launch.emit)
#: Testing only: every run's deadline times this (the JSON records it).
SCALE_ENV = "GPU_SMOKE_DEADLINE_SCALE"
GATE = "SLIME_RELOADABLE_PG"
MODE_ENV = "SLIME_RELOADABLE_PG_MODE"
SUSPEND_MIN = (2, 29, 7)  # ncclCommSuspend / ncclCommResume / ncclCommMemStats
MULTI_RANK_MIN = (2, 30, 0)  # NCCL_MULTI_RANK_GPU_ENABLE: two ranks on one GPU
SUSPEND_SYMBOLS = ("ncclCommSuspend", "ncclCommResume", "ncclCommMemStats")
NCCL_SUSPEND_MEM = 0x01
MEM_STATS = {"suspend": 0, "suspended": 1, "persist": 2, "total": 3}  # ncclCommMemStat_t
GROUPS = 4  # subgroups beside WORLD in the suspend measurements (Megatron makes about 20)
MiB = 2**20
GiB = 2**30


def error_line(error: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300] if text else ''}"


def _version(value: Any) -> tuple[int, ...] | None:
    """A version as a tuple of ints (from a tuple, a list or "2.28.9"), else None."""
    if isinstance(value, str):
        value = value.split("+")[0].split(".")
    try:
        parts = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        return None
    return parts or None


def _dotted(version: Any) -> str:
    parts = _version(version)
    return ".".join(map(str, parts)) if parts else "unknown"


# ---- the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One set of ranks started together: a rank program, a world size, a deadline."""

    label: str
    program: str
    world_size: int
    deadline_s: float
    env: dict[str, str] = field(default_factory=dict)
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class Step:
    """A step of the smoke run; ``plan`` says which runs it needs here, or why it cannot run."""

    name: str
    title: str
    plan: Callable[[Facts], tuple[list[Run], str | None]]

    def worst_runs(self) -> list[Run]:
        """The runs it takes where everything is there (every need met, two ranks per GPU)."""
        return self.plan(Facts(EVERYTHING, rehearse=False))[0]

    @property
    def worst_case_s(self) -> float:
        return sum(run_worst_case(r) for r in self.worst_runs())


def run_worst_case(run: Run) -> float:
    """A run's longest wall time: the GPU check, its deadline, then killing and reaping."""
    return CHECK_S + run.deadline_s + REAP_S


class Facts:
    """What the preflight found, asked the way the steps need it."""

    def __init__(self, pre: dict[str, Any], rehearse: bool) -> None:
        self.pre, self.rehearse = pre, rehearse
        get = self.get
        self.torch = get("torch", "version")
        self.cuda = bool(get("cuda", "available"))
        self.nccl_available = bool(get("torch", "nccl_available"))
        self.activated = bool(get("package", "activated"))
        self.backend_suspend = bool(get("capabilities", "backend_suspend"))
        self.reconfigure = bool(get("capabilities", "reconfigure"))
        self.comm_ptr = bool(get("capabilities", "comm_ptr"))
        self.runtime = _version(get("nccl", "library", "version")) or _version(
            get("nccl", "torch_runtime")
        )
        self.build = _version(get("nccl", "torch_build")) or _version(get("nccl", "build"))
        self.symbols = get("nccl", "library", "symbols") or {}
        self.c_api = get("nccl", "c_api") or {}
        self.nccl2 = bool(get("implementation", "nccl2_available"))
        self.nccl_means = get("implementation", "nccl")  # "classic" or "nccl2"
        self.nccl_legacy = bool(get("implementation", "nccl_legacy_available"))

    def get(self, *keys: str) -> Any:
        """The preflight's value at ``keys`` (None where any level is missing)."""
        return _dig(self.pre, *keys)

    def package_reason(self) -> str | None:
        if self.activated:
            return None
        return (
            "the package was not activated by the gate alone in a fresh rank (its .pth did not "
            "run or did not patch): install it into a site directory (docs/demo.md) and check "
            "with `python -m reloadpg_autopatch doctor`"
        )

    def suspend_method(self) -> tuple[str | None, str]:
        """How NCCL's suspend is measured here: torch's API, NCCL's C API, or not (why)."""
        if self.runtime is None:
            return None, "the NCCL version torch loaded is unknown (no libnccl in the process)"
        if self.runtime < SUSPEND_MIN:
            return None, (
                f"NCCL {_dotted(self.runtime)} < {_dotted(SUSPEND_MIN)}: the library has no "
                "ncclCommSuspend"
            )
        if self.backend_suspend and self.build is not None and self.build >= SUSPEND_MIN:
            return "torch", "torch's Backend.suspend / resume / memory_stats"
        missing = [s for s in SUSPEND_SYMBOLS if not self.symbols.get(s)]
        if missing:
            return None, f"the loaded libnccl lacks {', '.join(missing)}"
        if not self.c_api.get("callable"):
            return None, f"NCCL's C API did not answer as nccl.h says: {self.c_api}"
        if not self.comm_ptr:
            return None, "torch's ProcessGroupNCCL has no _comm_ptr(): no communicator to pass"
        why = "lacks Backend.suspend" if not self.backend_suspend else "was built without it"
        return "ctypes", (
            f"torch {self.torch} {why}: NCCL {_dotted(self.runtime)}'s C API through ctypes "
            "on torch's communicators (_comm_ptr)"
        )

    def torch_suspend_reason(self) -> str | None:
        """Why the package's suspend mode cannot run here (None: it can)."""
        if not self.backend_suspend:
            return f"torch {self.torch} has no Backend.suspend (torch 2.12 and later)"
        if self.rehearse:
            return None
        for label, version in (("built with", self.build), ("loaded", self.runtime)):
            if version is None or version < SUSPEND_MIN:
                return f"torch {label} NCCL {_dotted(version)}, suspend needs 2.29.7"
        return None

    def multi_rank(self) -> bool:
        """Two ranks on the one GPU (NCCL 2.30+); the rehearsal's stand-in says 2.30.7."""
        return self.rehearse or (self.runtime is not None and self.runtime >= MULTI_RANK_MIN)


#: A preflight that meets every step's needs: the plan at its longest, for the time table.
EVERYTHING: dict[str, Any] = {
    "torch": {"version": "any", "nccl_available": True},
    "cuda": {"available": True},
    "package": {"activated": True},
    "capabilities": {"backend_suspend": True, "reconfigure": True, "comm_ptr": True},
    "nccl": {
        "library": {"version": [2, 30, 7], "symbols": dict.fromkeys(SUSPEND_SYMBOLS, True)},
        "c_api": {"callable": True},
        "torch_build": [2, 30, 7],
    },
    "implementation": {"nccl2_available": True, "nccl_legacy_available": True, "nccl": "classic"},
}


def _dig(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _gpu_reason(facts: Facts) -> str | None:
    if facts.rehearse:
        return None
    if not facts.cuda:
        return "no CUDA device"
    if not facts.nccl_available:
        return f"torch {facts.torch} has no NCCL"
    return None


def _plan_preflight(_facts: Facts) -> tuple[list[Run], str | None]:
    return [Run("preflight", "preflight", 1, 40.0, {GATE: "1"})], None


def _plan_nccl_suspend(facts: Facts) -> tuple[list[Run], str | None]:
    if (reason := _gpu_reason(facts)) is not None:
        return [], reason
    method, why = facts.suspend_method()
    if facts.rehearse:
        method = "stand-in"
    elif method is None:
        return [], why
    runs = [Run("world size 1", "nccl_suspend", 1, 30.0, {}, ("--method", method))]
    if facts.multi_rank():
        multi = {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}
        runs.append(Run("world size 2", "nccl_suspend", 2, 45.0, multi, ("--method", method)))
    return runs, None


def _plan_wrapper_demo(facts: Facts) -> tuple[list[Run], str | None]:
    reason = _gpu_reason(facts) or facts.package_reason()
    if reason is not None:
        return [], reason
    backend = "gloo" if facts.rehearse else "nccl"
    env = {GATE: "1", MODE_ENV: "wrapper"}
    return [Run(f"demo on {backend}", "demo", 1, 50.0, env, ("--backend", backend))], None


def _plan_wrapper_checks(facts: Facts) -> tuple[list[Run], str | None]:
    reason = _gpu_reason(facts) or facts.package_reason()
    if reason is not None:
        return [], reason
    backend = "gloo" if facts.rehearse else "nccl"
    env = {GATE: "1", MODE_ENV: "wrapper"}
    return [Run(f"checks on {backend}", "checks", 1, 40.0, env, ("--backend", backend))], None


#: The implementations the suspend and in-place passes run on: plain ``nccl`` (nccl2 from torch
#: 2.15 on) and ``nccl-legacy`` (the classic ProcessGroupNCCL, by name, from torch 2.14 on).
IMPLEMENTATIONS = ("nccl", "nccl-legacy")
NCCL2_ENV = "TORCH_DIST_USE_NCCL2"


def _nccl_env(facts: Facts) -> dict[str, str]:
    """What the ``nccl`` pass needs for ``nccl`` to mean nccl2, as on torch 2.15: nothing
    there; on a torch where it means the classic backend and nccl2 exists (2.14),
    ``TORCH_DIST_USE_NCCL2=1`` (the ``nccl-legacy`` pass covers the classic one)."""
    if not facts.rehearse and facts.nccl_means == "classic" and facts.nccl2:
        return {NCCL2_ENV: "1"}
    return {}


def _passes(
    facts: Facts,
    label: str,
    program: str,
    size: int,
    *,
    env: dict[str, str],
    deadlines: tuple[float, float],
    legacy_options: tuple[str, ...] = (),
) -> list[Run]:
    """One run per implementation (``nccl-legacy`` where this torch has it)."""
    runs = []
    for backend, deadline in zip(IMPLEMENTATIONS, deadlines, strict=True):
        if backend == "nccl-legacy" and not (facts.rehearse or facts.nccl_legacy):
            continue
        extra = _nccl_env(facts) if backend == "nccl" else {}
        options = ("--backend", backend) + (legacy_options if backend != "nccl" else ())
        runs.append(
            Run(f"{label} on {backend}", program, size, deadline, {**env, **extra}, options)
        )
    return runs


def _plan_package_suspend(facts: Facts) -> tuple[list[Run], str | None]:
    reason = _gpu_reason(facts) or facts.package_reason() or facts.torch_suspend_reason()
    if reason is not None:
        return [], reason
    size = 2 if facts.multi_rank() else 1
    env = {GATE: "1", MODE_ENV: "suspend"}
    if size == 2:
        env["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
    # The classic pass runs one cycle: the nccl pass measures the second.
    label = f"suspend mode, world size {size},"
    runs = _passes(
        facts,
        label,
        "package_suspend",
        size,
        env=env,
        deadlines=(50.0, 30.0),
        legacy_options=("--cycles", "1"),
    )
    return runs, None


def _plan_native(facts: Facts) -> tuple[list[Run], str | None]:
    reason = _gpu_reason(facts) or facts.package_reason()
    if reason is None and not facts.reconfigure:
        reason = f"torch {facts.torch} has no ProcessGroup.reconfigure (torch 2.14 and later)"
    if reason is None and not facts.rehearse and not facts.nccl2:
        reason = f"torch {facts.torch} has no nccl2 backend (its entry point registered none)"
    if reason is not None:
        return [], reason
    env = {GATE: "1", MODE_ENV: "native"}
    # The classic backend cannot reconfigure: its pass checks the refusal, which is quick.
    return _passes(facts, "in place: checks", "checks", 1, env=env, deadlines=(27.0, 18.0)), None


def _plan_probes(facts: Facts) -> tuple[list[Run], str | None]:
    reason = _gpu_reason(facts)
    if reason is not None:
        return [], reason
    runs = []
    refusal = facts.package_reason() or facts.torch_suspend_reason()
    if refusal is None:
        strict = {GATE: "1", MODE_ENV: "suspend"}
        for name, value in (("NCCL_CUMEM_ENABLE", "0"), ("NCCL_COMM_SPLIT_SHARE_RESOURCES", "1")):
            env = {**strict, name: value}
            runs.append(Run(f"refused with {name}={value}", "refusal", 1, 18.0, env))
    method, why = facts.suspend_method()
    if facts.rehearse:
        method = "stand-in"
    if method is not None:
        options = ("--method", method)
        runs.append(Run("a raw collective while suspended", "raw_asleep", 1, 18.0, {}, options))
    if not runs:
        return [], f"{refusal}; and for the raw collective: {why}"
    return runs, None


STEPS = (
    Step("preflight", "what torch, CUDA, NCCL and the package are here", _plan_preflight),
    Step(
        "nccl_suspend",
        "NCCL's own suspend and resume on torch's communicators, against destroy + re-create",
        _plan_nccl_suspend,
    ),
    Step(
        "wrapper_demo",
        "the demo's cycle in the wrapper mode on nccl (Megatron's bound collectives on CUDA)",
        _plan_wrapper_demo,
    ),
    Step(
        "wrapper_checks",
        "WORLD swapped and back, the memory guard, a memory pool, the cycle report's figures",
        _plan_wrapper_checks,
    ),
    Step(
        "package_suspend",
        "the package's suspend mode on nccl and nccl-legacy: WORLD kept, the guard, no new "
        "group split from a sleeping WORLD, the report's NCCL figures",
        _plan_package_suspend,
    ),
    Step(
        "native_nccl2",
        "in place (native mode) on nccl and nccl-legacy: nccl2 rebuilt, the classic one refused",
        _plan_native,
    ),
    Step(
        "suspend_probes",
        "strict suspend refusals, then a raw collective on a suspended communicator",
        _plan_probes,
    ),
)


def worst_case_table() -> dict[str, Any]:
    """Each step's worst case in seconds (deadlines, plus a GPU check and reaping per run)."""
    rows = {s.name: s.worst_case_s for s in STEPS}
    return {
        "steps": rows,
        "total_s": sum(rows.values()),
        "budget_s": BUDGET_S,
        "per_run_overhead_s": CHECK_S + REAP_S,
        "run_deadlines_s": {s.name: [r.deadline_s for r in s.worst_runs()] for s in STEPS},
    }


# ---- the JSON ---------------------------------------------------------------------------------


class Record:
    """``smoke.json``: rewritten whole (a temporary file, then a rename) at every change."""

    def __init__(self, out: Path, rehearse: bool, budget: float, argv: list[str]) -> None:
        self.path = out / "smoke.json"
        self.started = time.monotonic()
        self.data: dict[str, Any] = {
            "schema": SCHEMA,
            "script": "scripts/gpu_smoke.py",
            "mode": "rehearsal" if rehearse else "gpu",
            "status": "running",
            "exit_code": None,
            "reason": None,
            "argv": argv,
            "python": sys.executable,
            "host": platform.node(),
            "started": _now(),
            "updated": _now(),
            "elapsed_s": 0.0,
            "budget_s": budget,
            "worst_case": worst_case_table(),
            "preflight": None,
            "plan": [s.name for s in STEPS],
            "steps": [],
            "warnings": [],
            "failures": [],
        }

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def write(self) -> None:
        self.data["updated"] = _now()
        self.data["elapsed_s"] = round(self.elapsed(), 2)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(self.data, handle, indent=1, default=str)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# ---- the GPU between runs ---------------------------------------------------------------------


def _nvidia_smi(query: str, kind: str, timeout: float) -> list[list[str]] | None:
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None
    try:
        done = subprocess.run(
            [tool, f"--query-{kind}={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=max(timeout, 0.5),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [[c.strip() for c in row.split(",")] for row in done.stdout.splitlines() if row.strip()]


def gpu_memory(rehearse: bool, wait_s: float = CHECK_S) -> dict[str, Any]:
    """The GPU's memory and compute processes before a run; waits up to ``wait_s`` for free."""
    if rehearse:
        return {"source": "rehearsal: no device", "ok": True}
    deadline = time.monotonic() + wait_s
    while True:
        query = "memory.used,memory.total,driver_version,name"
        rows = _nvidia_smi(query, "gpu", deadline - time.monotonic())
        if not rows or len(rows[0]) < 4:
            return {"source": "nvidia-smi unavailable", "ok": None}
        try:
            used, total = (int(float(v)) for v in rows[0][:2])
        except ValueError:
            return {"source": "nvidia-smi", "ok": None, "raw": rows[0]}
        apps = _nvidia_smi("pid,used_memory", "compute-apps", deadline - time.monotonic())
        reading = {
            "source": "nvidia-smi",
            "used_mib": used,
            "total_mib": total,
            "driver": rows[0][2],
            "name": rows[0][3],
            "processes": [row[0] for row in apps or []],
        }
        free = used <= max(1024, 0.03 * total) and not apps
        if free or time.monotonic() > deadline:
            return {**reading, "ok": free}
        time.sleep(0.5)


# ---- running ranks ----------------------------------------------------------------------------


class Interrupted(Exception):
    """SIGTERM or SIGINT reached this script: stop the ranks, write what there is, exit."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def _base_env() -> dict[str, str]:
    """This environment without the package's variables: a run adds the ones it means."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(GATE)}
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("PYTHONWARNINGS", "ignore::FutureWarning,ignore::UserWarning")
    return env


def _read(stream: Any, rank: int, channel: str, lines: queue.Queue) -> None:
    for line in stream:
        lines.put((rank, channel, line.rstrip("\n")))
    lines.put((rank, "eof", channel))


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Ranks:
    """The ranks of one run, each in a session of its own; ``stop`` kills every group."""

    def __init__(self, run: Run, rehearse: bool, on_news: Callable[[], None] | None = None) -> None:
        self.run, self.rehearse, self.on_news = run, rehearse, on_news
        self.news = False  # a rank reported something not yet passed to ``on_news``
        self.told = 0.0
        self.procs: list[subprocess.Popen] = []
        self.running_at_end: list[int] = []
        self.left: list[int] = []  # ranks (or their groups) still there after the kill
        self.lines: queue.Queue = queue.Queue()
        self.ranks = [
            {
                "rank": r,
                "exit_code": None,
                "data": {},
                "checks": [],
                "events": [],
                "stderr_tail": collections.deque(maxlen=20),
            }
            for r in range(run.world_size)
        ]

    def start(self) -> list[int]:
        port = _free_port()
        env = {**_base_env(), **self.run.env}
        for rank in range(self.run.world_size):
            argv = [sys.executable, str(RANKS), "--rank-program", self.run.program]
            argv += ["--rank", str(rank), "--world-size", str(self.run.world_size)]
            argv += ["--port", str(port), "--deadline", repr(self.run.deadline_s)]
            argv += ["--parent", str(os.getpid()), *self.run.options]
            argv += ["--rehearse"] if self.rehearse else []
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=str(ROOT),
                start_new_session=True,  # its own session and process group: killed as one
            )
            self.procs.append(proc)
            for channel, stream in (("out", proc.stdout), ("err", proc.stderr)):
                threading.Thread(
                    target=_read, args=(stream, rank, channel, self.lines), daemon=True
                ).start()
        return [p.pid for p in self.procs]

    def watch(self) -> str:
        """Until every rank ended or the deadline: "ok", "crashed" or "timeout".

        ``running_at_end`` then names the ranks that were still running when it stopped them.
        """
        deadline = time.monotonic() + self.run.deadline_s
        open_streams = 2 * len(self.procs)
        first_failure: float | None = None
        ended_at: float | None = None
        outcome = "ok"
        while open_streams:
            try:
                rank, channel, line = self.lines.get(timeout=0.1)
            except queue.Empty:
                rank = None
            if rank is not None:
                if channel == "eof":
                    open_streams -= 1
                else:
                    self._take(rank, channel, line)
            now = time.monotonic()
            if self.news and self.on_news is not None and now - self.told >= FLUSH_S:
                self.news, self.told = False, now
                self.on_news()
            codes = [p.poll() for p in self.procs]
            if first_failure is None and any(c not in (None, 0) for c in codes):
                first_failure = now
            if all(c is not None for c in codes):
                ended_at = ended_at or now
                if now - ended_at > REAP_S / 2:  # a grandchild holds the pipes: stop waiting
                    break
            late = first_failure is not None and now - first_failure > PEER_GRACE_S
            if late and any(c is None for c in codes):
                outcome = "crashed"
                break
            if now > deadline:
                outcome = "timeout"
                break
        self.running_at_end = [r for r, p in enumerate(self.procs) if p.poll() is None]
        self.left = self.stop()
        self._drain()
        for entry, proc in zip(self.ranks, self.procs, strict=True):
            entry["exit_code"] = proc.poll()
        if outcome == "ok" and any(e["exit_code"] != 0 for e in self.ranks):
            outcome = "crashed"
        return outcome

    def stop(self) -> list[int]:
        """Kill every rank's process group, reap the ranks; the pids of groups still alive."""
        for proc in self.procs:
            _kill_group(proc.pid)
        reaped_by = time.monotonic() + REAP_S  # one allowance for every rank of the run
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(reaped_by - time.monotonic(), 0.01))
        left = [p.pid for p in self.procs if p.poll() is None or _group_alive(p.pid)]
        for pgid in left:
            _kill_group(pgid)
        return left

    def _drain(self) -> None:
        while True:
            try:
                rank, channel, line = self.lines.get_nowait()
            except queue.Empty:
                return
            if channel != "eof":
                self._take(rank, channel, line)

    def _take(self, rank: int, channel: str, line: str) -> None:
        entry = self.ranks[rank]
        self.news = True
        for tag in (TAG, DEMO_TAG):
            if channel == "out" and line.startswith(tag):
                try:
                    event = json.loads(line[len(tag) :])
                except ValueError:
                    entry["stderr_tail"].append(f"(malformed event) {line[:300]}")
                    return
                if event.get("type") == "data":
                    entry["data"].update({k: v for k, v in event.items() if k != "type"})
                elif event.get("type") == "check":
                    entry["checks"].append({k: v for k, v in event.items() if k != "type"})
                else:
                    entry["events"].append(event)
                return
        if line.strip():
            entry["stderr_tail"].append(line[:500])


# ---- what the parent makes of a run -----------------------------------------------------------


def _run_failures(
    run: Run, outcome: str, ranks: list[dict[str, Any]], stopped: list[int]
) -> list[str]:
    failures = []
    if outcome == "timeout":
        failures.append(
            f"{run.label}: stopped at its deadline of {run.deadline_s:g} s; "
            f"still running: rank{'s' if len(stopped) > 1 else ''} " + ", ".join(map(str, stopped))
        )
    for entry in ranks:
        where = f"{run.label}, rank {entry['rank']}"
        for check in entry["checks"]:
            if check.get("status") == "failed":
                failures.append(f"{where}: {check.get('name')}: {check.get('detail')}")
        said = False
        for event in entry["events"]:
            if event.get("type") == "error":
                failures.append(f"{where}: {event.get('message')}")
                said = True
        killed = entry["rank"] in stopped
        if outcome != "ok" and entry["exit_code"] not in (0, None) and not said and not killed:
            tail = [t for t in entry["stderr_tail"] if t.strip()]
            failures.append(
                f"{where}: exit code {entry['exit_code']}" + (f": {tail[-1]}" if tail else "")
            )
    if outcome == "crashed" and not failures:
        failures.append(f"{run.label}: a rank ended without saying why")
    return failures


def _demo_checks(run: Run, ranks: list[dict[str, Any]], rehearse: bool) -> list[dict[str, Any]]:
    """The demo rank speaks the package's events; turn them into checks."""
    events = ranks[0]["events"]
    ready = next((e for e in events if e.get("type") == "ready"), None)
    cycles = [e for e in events if e.get("type") == "cycle"]
    checks = []
    if ready is None:
        return [{"name": "the demo set up", "status": "failed", "detail": "no 'ready' event"}]
    checks.append(
        {
            "name": "activated by the gate alone",
            "status": "ok" if ready.get("activation") == "pth" else "failed",
            "detail": f"activation {ready.get('activation')!r} (want 'pth')",
        }
    )
    bindings = ready.get("bindings") or {}
    if ready.get("megatron"):
        patched = bindings.get("patched", 0) + bindings.get("native", 0)
        checks.append(
            {
                "name": "Megatron's bound collectives",
                "status": "ok" if patched == bindings.get("found") else "failed",
                "detail": f"megatron-core {ready['megatron']}, bindings {bindings}",
            }
        )
    else:
        checks.append(
            {
                "name": "Megatron's bound collectives",
                "status": "skipped",
                "detail": "skipped: megatron-core not installed (plain torch groups instead)",
            }
        )
    for cycle in cycles:
        live, destroyed, _reloaded = cycle.get("free_mib") or (None, None, None)
        if live is None or rehearse:
            continue
        wrapper = "wrapper" in run.env.get(MODE_ENV, "")
        checks.append(
            {
                "name": f"cycle {cycle['cycle']}: destroy gave GPU memory back",
                "status": "ok" if destroyed > live or not wrapper else "failed",
                "detail": f"free MiB live {live:.0f}, after destroy {destroyed:.0f}",
            }
        )
    want = int(_option(run, "--cycles", "2"))
    checks.append(
        {
            "name": "every cycle reported",
            "status": "ok" if len(cycles) == want else "failed",
            "detail": f"{len(cycles)} of {want} cycles",
        }
    )
    return checks


def _option(run: Run, name: str, default: str) -> str:
    options = list(run.options)
    return options[options.index(name) + 1] if name in options else default


def execute(run: Run, rehearse: bool, record: Record, step: dict[str, Any]) -> dict[str, Any]:
    """Start ``run``'s ranks after checking the GPU; its record, ranks' data included."""
    entry: dict[str, Any] = {
        "label": run.label,
        "program": run.program,
        "world_size": run.world_size,
        "env": run.env,
        "options": list(run.options),
        "deadline_s": run.deadline_s,
        "memory_before": gpu_memory(rehearse),
        "outcome": "running",
        "pids": [],
        "wall_s": None,
        "leftover_groups": [],
        "ranks": [],
        "failures": [],
    }
    if entry["memory_before"].get("ok") is False:
        record.data["warnings"].append(
            f"{step['name']} / {run.label}: the GPU was not free before it: "
            f"{entry['memory_before']}"
        )
    step["runs"].append(entry)

    def news() -> None:  # what the ranks said so far, so that a cut run keeps it too
        entry["ranks"] = _rank_records(ranks.ranks)
        record.write()

    ranks = Ranks(run, rehearse, on_news=news)
    started = time.monotonic()
    try:
        entry["pids"] = ranks.start()
        record.write()  # a cut run shows which ranks were running
        outcome = ranks.watch()
    except BaseException:
        ranks.stop()
        entry["outcome"] = "interrupted"
        entry["wall_s"] = round(time.monotonic() - started, 2)
        entry["ranks"] = _rank_records(ranks.ranks)
        raise
    entry["wall_s"] = round(time.monotonic() - started, 2)
    entry["leftover_groups"] = ranks.left
    rank_records = _rank_records(ranks.ranks)
    if run.program == "demo":
        rank_records[0]["checks"] += _demo_checks(run, rank_records, rehearse)
    entry["ranks"] = rank_records
    entry["failures"] = _run_failures(run, outcome, rank_records, ranks.running_at_end)
    entry["stopped_ranks"] = ranks.running_at_end
    if entry["leftover_groups"]:
        entry["failures"].append(f"{run.label}: processes outlived the kill")
    if outcome == "ok" and entry["failures"]:
        outcome = "failed"
    entry["outcome"] = outcome
    for rank in rank_records:
        start = rank["data"].get("memory_at_start") or {}
        if not rehearse and start.get("free") and start["free"] < 0.9 * start.get("total", 0):
            record.data["warnings"].append(
                f"{step['name']} / {run.label}, rank {rank['rank']}: "
                f"{start['free'] / GiB:.1f} of {start['total'] / GiB:.1f} GiB free at its start"
            )
    return entry


def _rank_records(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**r, "stderr_tail": list(r["stderr_tail"])} for r in ranks]


_SEVERITY = {"ok": 0, "failed": 1, "crashed": 2, "timeout": 3, "interrupted": 4}


def run_step(
    step: Step, facts: Facts, record: Record, budget: float
) -> tuple[dict[str, Any], list[Run]]:
    """Plan and run one step, writing the JSON as it starts and as it ends."""
    entry: dict[str, Any] = {
        "name": step.name,
        "title": step.title,
        "status": "running",
        "reason": None,
        "worst_case_s": None,
        "started_s": round(record.elapsed(), 2),
        "wall_s": None,
        "runs": [],
        "summary": {},
        "failures": [],
    }
    record.data["steps"].append(entry)
    runs, reason = step.plan(facts)
    scale = record.data.get("deadline_scale", 1.0)
    if scale != 1.0:
        runs = [dataclasses.replace(r, deadline_s=r.deadline_s * scale) for r in runs]
    worst = sum(run_worst_case(r) for r in runs)
    entry["worst_case_s"] = worst
    left = budget - record.elapsed()
    if reason is None and step.name != "preflight" and worst > left:
        reason = f"budget: needs up to {worst:.0f} s, {max(left, 0):.0f} s left of {budget:g} s"
    if reason is not None:
        entry.update(status="skipped", reason=f"skipped: {reason}", wall_s=0.0)
        record.write()
        return entry, runs
    record.write()
    started = time.monotonic()
    try:
        for run in runs:
            done = execute(run, facts.rehearse, record, entry)
            entry["failures"] += done["failures"]
            record.write()
    except BaseException:
        entry.update(status="interrupted", wall_s=round(time.monotonic() - started, 2))
        entry["reason"] = "interrupted: this script was told to stop"
        raise
    entry["wall_s"] = round(time.monotonic() - started, 2)
    worst_outcome = max((r["outcome"] for r in entry["runs"]), key=_SEVERITY.__getitem__)
    entry["status"] = worst_outcome
    if worst_outcome != "ok":
        entry["reason"] = entry["failures"][0] if entry["failures"] else worst_outcome
    entry["summary"] = _summary(step.name, entry)
    record.data["failures"] += [f"{step.name}: {f}" for f in entry["failures"]]
    record.write()
    return entry, runs


def _summary(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    """The figures a reader wants first, from rank 0 of each run."""
    out: dict[str, Any] = {}
    for run in entry["runs"]:
        if not run["ranks"]:
            continue
        data = run["ranks"][0]["data"]
        if "summary" in data:
            out[run["label"]] = data["summary"]
        elif run["program"] == "demo":
            cycles = [e for e in run["ranks"][0]["events"] if e.get("type") == "cycle"]
            out[run["label"]] = [
                {
                    "cycle": c["cycle"],
                    "destroy_ms": round(c["destroy_ms"], 1),
                    "reload_ms": round(c["reload_ms"], 1),
                    "free_mib": c.get("free_mib"),
                    "freed_bytes": (c.get("report") or {}).get("freed_bytes"),
                }
                for c in cycles
            ]
    if name == "preflight" and entry["runs"] and entry["runs"][0]["ranks"]:
        out = {"see": "the top-level 'preflight'"}
    return out


# ---- the parent -------------------------------------------------------------------------------


def _preflight_data(entry: dict[str, Any]) -> dict[str, Any]:
    runs = entry["runs"]
    data = dict(runs[0]["ranks"][0]["data"]) if runs and runs[0]["ranks"] else {}
    data["nvidia_smi"] = runs[0]["memory_before"] if runs else None  # the driver, the GPU
    return data


def _no_device(pre: dict[str, Any]) -> str | None:
    if _dig(pre, "torch", "version") is None:
        return f"torch is not importable here: {_dig(pre, 'torch_error') or 'no preflight data'}"
    if not _dig(pre, "cuda", "available"):
        return (
            f"no CUDA device: torch {_dig(pre, 'torch', 'version')} sees no GPU "
            "(torch.cuda.is_available() is False); --rehearse rehearses the steps on CPU"
        )
    if not _dig(pre, "torch", "nccl_available"):
        return f"torch {_dig(pre, 'torch', 'version')} has no NCCL"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="folder for smoke.json (created if missing)")
    parser.add_argument(
        "--budget",
        type=float,
        default=BUDGET_S,
        metavar="SECONDS",
        help=f"start no step whose worst case no longer fits (default {BUDGET_S:g})",
    )
    parser.add_argument("--rehearse", action="store_true", help="the same steps on CPU")
    parser.add_argument(
        "--steps",
        metavar="NAME,...",
        help="run only these steps (and the preflight); e.g. a second try with the time left: "
        + ", ".join(s.name for s in STEPS[1:]),
    )
    parser.add_argument("--plan", action="store_true", help="print the worst-case table")
    args = parser.parse_args(argv)
    if args.plan:
        print(json.dumps(worst_case_table(), indent=1))
        return 0
    if not args.out:
        parser.error("--out DIR is required")
    names = {s.name for s in STEPS}
    args.selected = None
    if args.steps:
        args.selected = {n.strip() for n in args.steps.split(",") if n.strip()}
        if unknown := sorted(args.selected - names):
            parser.error(f"--steps: no step {', '.join(unknown)}; the steps: {sorted(names)}")
    try:
        scale = float(os.environ.get(SCALE_ENV, "1"))
    except ValueError:
        parser.error(f"{SCALE_ENV} must be a number")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = Record(out, args.rehearse, args.budget, argv)
    record.data["selected"] = sorted(args.selected) if args.selected else None
    record.data["deadline_scale"] = scale
    record.write()

    def interrupted(signum: int, _frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, interrupted)
    try:
        code = _steps(record, args)
    except Interrupted as stop:
        record.data.update(status="interrupted", reason=f"stopped by {stop}", exit_code=130)
        record.write()
        print(f"gpu_smoke: interrupted ({stop}); {record.path} holds the steps so far")
        return 130
    record.data["exit_code"] = code
    record.write()
    return code


def _steps(record: Record, args: argparse.Namespace) -> int:
    mode = "rehearsal" if args.rehearse else "GPU"
    print(f"gpu_smoke ({mode}): writing {record.path} after every step", flush=True)
    preflight, _ = run_step(STEPS[0], Facts({}, args.rehearse), record, args.budget)
    pre = _preflight_data(preflight)
    record.data["preflight"] = pre
    _say(preflight)
    if preflight["status"] != "ok" and not pre.get("torch"):
        record.data.update(status="done", reason="the preflight failed: see steps[0]")
        record.write()
        return 1
    if not args.rehearse and (reason := _no_device(pre)) is not None:
        record.data.update(status="no-device", reason=reason, exit_code=2)
        for step in STEPS[1:]:
            record.data["steps"].append(_skipped(step, reason))
        record.write()
        print(f"gpu_smoke: {reason}; nothing else was run", file=sys.stderr)
        return 2
    facts = Facts(pre, args.rehearse)
    for step in STEPS[1:]:
        if args.selected is not None and step.name not in args.selected:
            entry = _skipped(step, "not selected (--steps)")
            record.data["steps"].append(entry)
            record.write()
        else:
            entry, _runs = run_step(step, facts, record, args.budget)
        _say(entry)
    record.data["status"] = "done"
    failures = record.data["failures"]
    for failure in failures:
        print(f"FAILED: {failure}")
    print("gpu_smoke: OK" if not failures else "gpu_smoke: FAILED", flush=True)
    return 1 if failures else 0


def _skipped(step: Step, reason: str) -> dict[str, Any]:
    return {
        "name": step.name,
        "title": step.title,
        "status": "skipped",
        "reason": f"skipped: {reason}",
        "worst_case_s": 0.0,
        "started_s": None,
        "wall_s": 0.0,
        "runs": [],
        "summary": {},
        "failures": [],
    }


def _say(entry: dict[str, Any]) -> None:
    wall = f" ({entry['wall_s']:.1f} s)" if entry.get("wall_s") else ""
    if entry["status"] == "skipped":
        print(f"[{entry['name']}] {entry['reason']}", flush=True)
        return
    reason = f": {entry['reason']}" if entry.get("reason") else ""
    print(f"[{entry['name']}] {entry['status']}{wall}{reason}", flush=True)
    for name, figures in (entry.get("summary") or {}).items():
        print(f"  {name}: {json.dumps(figures, default=str)[:400]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
