"""Command line: ``python -m reloadpg_autopatch doctor|demo``.

Exit codes: 0 healthy / success, 1 problems found / the demo failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import sys

from ._env import MODES
from .tools.demo import MAX_WORLD_SIZE
from .tools.demo_framework import FRAMEWORKS
from .tools.doctor import cli as doctor_cli


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m reloadpg_autopatch",
        description="Reloadable torch.distributed process groups for Megatron-based RL training.",
    )
    commands = parser.add_subparsers(dest="command", metavar="{doctor,demo}")
    doctor = commands.add_parser(
        "doctor", help="report what is and is not patched in this interpreter"
    )
    doctor_cli.add_arguments(doctor)

    demo = commands.add_parser(
        "demo", help="destroy and reload Megatron's groups on N CPU ranks (the main job)"
    )
    demo.add_argument(
        "--world-size",
        type=int,
        default=4,
        metavar="N",
        help=f"ranks, each a fresh interpreter here (default 4, at most {MAX_WORLD_SIZE})",
    )
    demo.add_argument(
        "--cycles",
        type=int,
        default=3,
        metavar="K",
        help="destroy/reload cycles (default 3); with --framework, training steps of two each",
    )
    demo.add_argument("--backend", choices=("gloo", "nccl", "nccl2"), default="gloo")
    demo.add_argument(
        "--mode",
        choices=MODES,
        default=None,
        help="how groups reload: behind a wrapper, in place (torch 2.14+), suspended (an NCCL "
        "backend: a GPU), or the best each group allows (default wrapper; with --framework, "
        "suspend)",
    )
    demo.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        default=None,
        help="run an unmodified actor-shaped program of this framework instead, its lifecycle "
        "adopted, on a CPU model of NCCL's suspend",
    )
    demo.add_argument(
        "--port", type=int, default=0, help="rendezvous port on 127.0.0.1 (default: a free one)"
    )
    demo.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="seconds for the whole run, starting the ranks included, before every rank is "
        "stopped (default 120)",
    )
    demo.add_argument("--json", action="store_true", help="print one JSON report at the end")
    demo.add_argument(
        "--inject-failure",
        type=int,
        metavar="RANK",
        help="testing: make RANK raise in the first cycle, to see the demo stop and name it",
    )
    return parser


def _demo(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.world_size < 1:
        parser.error(f"--world-size must be at least 1, got {args.world_size}")
    if args.world_size > MAX_WORLD_SIZE:
        parser.error(
            f"--world-size must be at most {MAX_WORLD_SIZE} (each rank is a whole interpreter "
            f"with torch on this one machine), got {args.world_size}"
        )
    if args.cycles < 0:
        parser.error(f"--cycles must be 0 or more, got {args.cycles}")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be 0 (any free port) or 1-65535, got {args.port}")
    if not 0 < args.timeout < float("inf"):  # also NaN
        parser.error(f"--timeout must be a positive, finite number of seconds, got {args.timeout}")
    if args.mode is None:
        args.mode = "suspend" if args.framework else "wrapper"
    if args.framework and args.backend != "gloo":
        parser.error("--framework runs on CPU (a CPU model of NCCL's suspend): leave --backend out")
    if args.framework and args.inject_failure is not None:
        parser.error("--inject-failure is for the default demo, not --framework")
    if args.mode == "suspend" and args.backend == "gloo" and not args.framework:
        parser.error(
            "--mode suspend needs an accelerator backend that can suspend (--backend nccl or "
            "nccl2, on a GPU): gloo holds no accelerator memory, so there is nothing to suspend; "
            "on CPU use --mode wrapper, native or auto, or --framework slime, which runs on a "
            "CPU model of NCCL's suspend"
        )
    if args.inject_failure is not None and not 0 <= args.inject_failure < args.world_size:
        parser.error(f"--inject-failure must name a rank from 0 to {args.world_size - 1}")
    # The launcher and every rank need torch: without it, one line instead of a traceback.
    try:
        import torch.distributed  # noqa: F401
    except ModuleNotFoundError as error:
        if error.name != "torch":
            raise
        print(
            f"{parser.prog} demo: error: torch is not installed in this interpreter "
            f"({sys.executable}); install torch into this environment to run the demo",
            file=sys.stderr,
        )
        return 1
    from .tools.demo import run_demo
    from .tools.demo_framework import run_framework_demo
    from .tools.launch import PortInUse

    try:
        if args.framework:
            return run_framework_demo(
                args.framework,
                args.world_size,
                args.cycles,
                args.mode,
                port=args.port,
                timeout=args.timeout,
                as_json=args.json,
            )
        return run_demo(
            args.world_size,
            args.cycles,
            args.backend,
            mode=args.mode,
            port=args.port,
            timeout=args.timeout,
            as_json=args.json,
            inject_failure=args.inject_failure,
        )
    except PortInUse as error:
        print(f"{parser.prog} demo: error: {error}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return doctor_cli.run(args.imports, json=args.json)
    if args.command == "demo":
        return _demo(parser, args)
    parser.print_usage(sys.stderr)
    print(f"{parser.prog}: error: choose a command: doctor or demo", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
