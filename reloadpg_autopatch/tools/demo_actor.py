"""One rank of ``demo --framework slime``: an unmodified slime-shaped actor, driven step by step.

Run by ``demo`` through ``launch``, each rank a fresh interpreter whose environment holds the
gate, the mode, and ``SLIME_RELOADABLE_PG_ADOPT_MODULES`` naming the actor's lifecycle module.
This harness does what the machine and the driver do around a real actor: it registers the CPU
model of NCCL's suspend (as a GPU image has NCCL), puts WORLD's address in the environment (as
Ray does), calls the actor's ``init``, ``train`` and ``update_weights``, and reports what the
backends and the package saw. The actor itself never imports the package.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace
from typing import Any

from . import launch


class Mismatch(AssertionError):
    """A step gave a wrong result, or the suspend mode did not do what it promises."""


def _adoption() -> dict[str, Any]:
    from ..adoption import seen as adoption

    seen = [s for s in adoption.status()["seen"] if s["module"] == LIFECYCLE]
    if not seen:
        return {"adopted": [], "kept": "never imported"}
    return {"adopted": seen[0]["adopted"], "kept": seen[0]["kept"]}


#: The actor's lifecycle module, which the demo's ranks adopt by name.
LIFECYCLE = "reloadpg_autopatch.tools.framework_demo.reloadable_process_group"
#: The backend of WORLD and the actor's groups: the package's CPU model of NCCL's suspend
#: (``cpu_nccl``, gloo for every collective) under a name of its own, with a 4 MiB
#: communicator buffer that a suspend frees and a resume restores.
BACKEND = "cpu_suspend"
BUFFER_BYTES = 4 * 2**20
PERSIST_BYTES = 256 * 2**10


def _counts(backends: list[Any]) -> list[tuple[int, int]]:
    return [(b.suspends, b.resumes) for b in backends]


def run(args: Any) -> None:
    launch.emit({"type": "up", "rank": args.rank})
    from . import cpu_nccl

    backend = cpu_nccl.register_variant(
        BACKEND,
        suspend_bytes=BUFFER_BYTES,
        persist_bytes=PERSIST_BYTES,
        barrier_timeout=args.timeout,  # a rank whose peer died gives up within the demo's time
    )
    os.environ.update(
        MASTER_ADDR=args.host,
        MASTER_PORT=str(args.port),
        RANK=str(args.rank),
        WORLD_SIZE=str(args.world_size),
        TORCHELASTIC_USE_AGENT_STORE="True",  # the launcher hosts the store, as torchrun's agent
    )
    import reloadpg_autopatch as package  # the harness reads what happened; the actor never

    from .framework_demo import actor as actor_module
    from .framework_demo import reloadable_process_group as their

    actor = actor_module.MegatronTrainRayActor()
    minutes = max(args.timeout / 60, 0.5)
    actor.init(SimpleNamespace(distributed_backend=backend, distributed_timeout_minutes=minutes))
    backends = cpu_nccl.backends(BACKEND)
    made = cpu_nccl.creations(BACKEND)
    suspend = package.get_reload_mode() == "suspend"
    launch.emit(
        {
            "type": "ready",
            "mode": package.get_reload_mode(),
            "adoption": _adoption(),
            "backends": len(backends),
        }
    )
    size = args.world_size
    total = size * (size + 1) / 2
    in_pair = args.rank < size - size % 2
    for step in range(1, args.steps + 1):
        before = _counts(backends)
        trained = actor.train(step)
        weights = actor.update_weights()
        if trained != (2 * total if in_pair else total) or weights != 100.0:
            raise Mismatch(f"rank {args.rank}, step {step}: trained {trained}, weights {weights}")
        after = _counts(backends)
        cycled = [(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before, strict=True)]
        created = cpu_nccl.creations(BACKEND) - made
        if suspend and (created or any(c not in ((2, 2), (0, 0)) for c in cycled)):
            raise Mismatch(
                f"rank {args.rank}, step {step}: (suspends, resumes) per backend {cycled}, "
                f"{created} backends created; suspend mode promises (2, 2) and none"
            )
        report = package.last_cycle_report()
        launch.emit(
            {
                "type": "step",
                "step": step,
                "trained": trained,
                "weights": weights,
                "suspended": sum(1 for c in cycled if c[0]),
                "cycles": report.cycle if report is not None else None,
                "created": created,
                "their_groups": len(their.ReloadableProcessGroup.GROUPS.get(os.getpid(), [])),
            }
        )


def main(argv: list[str] | None = None) -> int:
    parser = launch.rank_parser("one rank of python -m reloadpg_autopatch demo --framework slime")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    try:
        run(args)
    except Exception as error:
        launch.fail(error)
    launch.emit({"type": "done"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
