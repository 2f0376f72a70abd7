"""Benchmarks for reloadpg_autopatch: ``python -m benchmarks`` (or ``make bench``).

Every figure is measured side by side in one run, interleaved, and reported as a median with
its interquartile range, next to its target from DESIGN.md and a verdict.
"""
