"""What borrows a communicator, released the way its owner releases it, before any is freed.

A communicator is not the package's alone. TransformerEngine's NCCL EP borrows the
expert-parallel group's (``ep_bootstrap``), Megatron's fused all-to-all and symmetric-memory
buffers are registered with communicators, and a CUDA graph that captured a collective keeps its
communicator (NCCL 2.31's destroy waits until such graphs are gone). Megatron releases them in
``destroy_model_parallel()`` before it tears its groups down, and rebuilds them lazily
(``ensure_nccl_ep_bootstrapped``, buffers remade for a group on their next use). So each
destroy that begins a cycle runs Megatron's releases first, where the process has Megatron:

- with Megatron-LM's teardown registry (``parallel_state.register_model_parallel_teardown``):
  the ``RELEASE_COMMUNICATION`` callbacks, then the ``RELEASE_CUDA_GRAPHS`` ones, each stage's
  later registration first and each callback once, as ``destroy_model_parallel`` runs them;
  never ``VALIDATE`` or ``RESET_STATE``, and never Megatron's group globals;
- without it (megatron-core 0.19.2): ``fused_a2a.nccl_ep_finalize()``, looked up when the
  destroy runs (a program may have replaced it), as ``destroy_model_parallel`` calls it.

Only modules already imported are read: nothing here imports Megatron. A release that raises
does not stop the others; the destroy then refuses on every rank (``ReleaseError``, agreed
through the destroy's round), before anything is freed.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("reloadpg_autopatch")

#: Megatron's module that holds the registry and its groups.
PARALLEL_STATE = "megatron.core.parallel_state"
#: Megatron's module that holds ``nccl_ep_finalize``.
FUSED_A2A = "megatron.core.transformer.moe.fused_a2a"
#: The registry's stages that release what borrows a communicator, in the order they run.
STAGES = ("RELEASE_COMMUNICATION", "RELEASE_CUDA_GRAPHS")
#: How the doctor and the report name where the releases come from.
REGISTRY, FINALIZE, NONE = "registry", "fused_a2a.nccl_ep_finalize", "none"


@dataclass(frozen=True)
class Release:
    """One callback a destroy runs first: its name, its stage, the callable."""

    name: str
    stage: str
    callback: Callable[[], Any]


@dataclass
class Outcome:
    """What one release did on this rank."""

    name: str
    stage: str
    ms: float
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stage": self.stage,
            "ms": round(self.ms, 3),
            "error": self.error,
        }


def _name(callback: Any) -> str:
    module = getattr(callback, "__module__", None) or "?"
    return f"{module}.{getattr(callback, '__qualname__', None) or repr(callback)}"


def _teardown(state: Any) -> tuple[Any, dict[Any, list[Any]]] | None:
    """Megatron's ``(TeardownStage, callbacks per stage)``, where this Megatron has them."""
    stages = getattr(state, "TeardownStage", None)
    callbacks = getattr(state, "_MODEL_PARALLEL_TEARDOWN_CALLBACKS", None)
    register = getattr(state, "register_model_parallel_teardown", None)
    if stages is None or not isinstance(callbacks, dict) or not callable(register):
        return None
    return stages, callbacks


def found() -> tuple[str, list[Release]]:
    """Where the releases come from (``REGISTRY``, ``FINALIZE`` or ``NONE``), and them, in
    the order a destroy runs them."""
    state = sys.modules.get(PARALLEL_STATE)
    teardown = _teardown(state) if state is not None else None
    if teardown is not None:
        stages, callbacks = teardown
        out = []
        for stage_name in STAGES:
            stage = getattr(stages, stage_name, None)
            seen: set[int] = set()
            for callback in reversed(list(callbacks.get(stage, ()))):
                if id(callback) in seen or not callable(callback):
                    continue
                seen.add(id(callback))
                out.append(Release(_name(callback), stage_name, callback))
        return REGISTRY, out
    a2a = sys.modules.get(FUSED_A2A)
    finalize = getattr(a2a, "nccl_ep_finalize", None) if a2a is not None else None
    if callable(finalize):
        return FINALIZE, [Release(f"{FUSED_A2A}.nccl_ep_finalize", STAGES[0], finalize)]
    return NONE, []


def run() -> list[Outcome]:
    """Run every release, each timed; one that raises is recorded and the others still run."""
    outcomes = []
    for release in found()[1]:
        started = time.perf_counter()
        error = None
        try:
            release.callback()
        except Exception as raised:  # the others still run; the destroy then refuses
            error = f"{type(raised).__name__}: {raised}"
            logger.error(
                "%s (%s) raised before the destroy: %s", release.name, release.stage, error
            )
        ms = (time.perf_counter() - started) * 1e3
        outcomes.append(Outcome(release.name, release.stage, ms, error))
    return outcomes


def failures(outcomes: list[Outcome]) -> list[str]:
    """One line per release that raised here (what the destroy's round carries)."""
    return [f"{o.name} ({o.stage}) raised {o.error}" for o in outcomes if o.error is not None]


def describe() -> str:
    """The doctor's words for what a destroy would release first in this process."""
    source, releases = found()
    if source == NONE:
        return (
            "none found (Megatron's teardown registry and fused_a2a.nccl_ep_finalize are read "
            "when a destroy runs, where Megatron is imported)"
        )
    if source == FINALIZE:
        return f"{FUSED_A2A}.nccl_ep_finalize() (megatron-core without the teardown registry)"
    counts = [f"{stage} {sum(r.stage == stage for r in releases)}" for stage in STAGES]
    return f"Megatron's teardown registry: {', '.join(counts)} callbacks"
