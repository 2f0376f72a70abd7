"""The wire form of the ranks' answers: names and ranks as runs of numbers.

At scale an agreement's result names every group of the world and is read by every rank, so
decimal names (torch names groups with a counter) travel as runs (``[[0, 17999]]``), and what
each rank reads stays small as the world grows; ranks travel the same way.
"""

from __future__ import annotations

import json
from typing import Any


def pack_names(names: set[str]) -> dict[str, list[Any]]:
    """``names`` with decimal ones (torch's group names are a counter) packed into runs."""
    numbers = sorted(int(n) for n in names if n.isascii() and n.isdigit() and str(int(n)) == n)
    runs: list[list[int]] = []
    for number in numbers:
        if runs and runs[-1][1] == number - 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    packed = {str(n) for n in numbers}
    return {"runs": runs, "names": sorted(names - packed)}


def unpack_names(packed: dict[str, list[Any]]) -> list[str]:
    out = [str(n) for first, last in packed["runs"] for n in range(first, last + 1)]
    return out + list(packed["names"])


def merge_name_sets(entries: list[bytes]) -> bytes:
    """Untyped answers merged by value: a list becomes the union, a boolean the ``any`` (the
    same wire form as ``Answers.merge``, for tools that build their own answers)."""
    sets: dict[str, set[str]] = {}
    flags: dict[str, bool] = {}
    for entry in entries:
        for name, value in json.loads(entry).items():
            if isinstance(value, bool):
                flags[name] = flags.get(name, False) or value
            else:
                sets.setdefault(name, set()).update(value)
    merged: dict[str, Any] = {name: pack_names(values) for name, values in sets.items()}
    return json.dumps(merged | flags, separators=(",", ":")).encode()


def expand_name_sets(merged: bytes) -> dict[str, Any]:
    """The object ``merge_name_sets`` packed: lists of names and booleans again."""
    return {
        name: value if isinstance(value, bool) else unpack_names(value)
        for name, value in json.loads(merged).items()
    }


def pack_ranks(ranks: list[int]) -> dict[str, list[Any]]:
    return pack_names({str(r) for r in ranks})


def ranks_of(packed: dict[str, list[Any]]) -> list[int]:
    """The ranks ``merge_ways`` or ``merge_by_rank`` packed."""
    return sorted(int(r) for r in unpack_names(packed))
