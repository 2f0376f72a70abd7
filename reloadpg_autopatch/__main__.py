"""Command line: ``python -m reloadpg_autopatch doctor|demo``.

Exit codes: 0 healthy / success, 1 problems found / the demo failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m reloadpg_autopatch",
        description="Reloadable torch.distributed process groups for Megatron-based RL training.",
    )
    commands = parser.add_subparsers(dest="command", metavar="{doctor,demo}")
    doctor = commands.add_parser(
        "doctor", help="report what is and is not patched in this interpreter"
    )
    doctor.add_argument(
        "--import",
        dest="imports",
        metavar="MOD",
        nargs="+",
        action="extend",
        default=[],
        help="import these modules first (as the training process would), then check them",
    )
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from .doctor import diagnose, render

        report = diagnose(args.imports)
        print(json.dumps(report.to_dict(), indent=2) if args.json else render(report))
        return 1 if report.problems else 0
    parser.print_usage(sys.stderr)
    print(f"{parser.prog}: error: choose a command: doctor or demo", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
