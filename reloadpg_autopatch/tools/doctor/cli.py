"""``python -m reloadpg_autopatch doctor [--import MOD ...] [--json]``: its arguments, and the
run that prints the report and returns its exit code."""

from __future__ import annotations

import argparse

from .gather import diagnose
from .renderer import as_json, render


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The doctor's arguments, on its subcommand's parser."""
    parser.add_argument(
        "--import",
        dest="imports",
        metavar="MOD",
        nargs="+",
        action="extend",
        default=[],
        help="import these modules first (as the training process would), then check them",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(imports: list[str], json: bool = False) -> int:
    """Diagnose this interpreter, print the report (as JSON with ``json``), and return the
    exit code: 0 healthy (the gate off included), 1 problems found."""
    report = diagnose(imports)
    print(as_json(report) if json else render(report))
    return report.exit_code
