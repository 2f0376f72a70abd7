"""The plan: a step is runs of ranks, each with a deadline; what the preflight found decides
which runs a step needs here, or why it cannot run; the worst case of each run is what the
budget and the time table count."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .common import (
    CHECK_S,
    IMPLEMENTATIONS,
    MULTI_RANK_MIN,
    NCCL2_ENV,
    REAP_S,
    SUSPEND_MIN,
    SUSPEND_SYMBOLS,
    dig,
)


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
        return dig(self.pre, *keys)

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


def gpu_reason(facts: Facts) -> str | None:
    """Why no GPU step can run here (None: one can; the rehearsal needs none)."""
    if facts.rehearse:
        return None
    if not facts.cuda:
        return "no CUDA device"
    if not facts.nccl_available:
        return f"torch {facts.torch} has no NCCL"
    return None


def _nccl_env(facts: Facts) -> dict[str, str]:
    """What the ``nccl`` pass needs for ``nccl`` to mean nccl2, as on torch 2.15: nothing
    there; on a torch where it means the classic backend and nccl2 exists (2.14),
    ``TORCH_DIST_USE_NCCL2=1`` (the ``nccl-legacy`` pass covers the classic one)."""
    if not facts.rehearse and facts.nccl_means == "classic" and facts.nccl2:
        return {NCCL2_ENV: "1"}
    return {}


def passes(
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
