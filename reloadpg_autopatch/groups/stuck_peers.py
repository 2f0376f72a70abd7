"""Who a stuck free waits for: what each stuck rank writes, and the ranks that never came.

Every stuck rank appends one entry to a key of the step (``frees._Context``): the group it is
stuck in and that group's members, as arithmetic runs ``[first, step, count]``, so that the
entry stays tens of bytes whatever the world's size (a Megatron group, contiguous or strided,
is one run; WORLD at 4,096 ranks is ``[[0, 1, 4096]]``). At 4,096 ranks every survivor is
stuck in WORLD's free at once: each then reads the others' entries once or twice, about 4,096
short entries, not 4,096 member lists. Torch-free.
"""

from __future__ import annotations

import json
from typing import Any

from .store import entries


def runs(ranks: list[int]) -> list[list[int]]:
    """``ranks`` (sorted, distinct) as maximal arithmetic runs ``[first, step, count]``."""
    out: list[list[int]] = []
    i = 0
    while i < len(ranks):
        if i + 1 == len(ranks):
            out.append([ranks[i], 1, 1])
            break
        step = ranks[i + 1] - ranks[i]
        j = i + 1
        while j + 1 < len(ranks) and ranks[j + 1] - ranks[j] == step:
            j += 1
        out.append([ranks[i], step, j - i + 1])
        i = j + 1
    return out


def ranks_of(packed: list[list[int]]) -> list[int]:
    """The ranks ``runs`` packed."""
    return [first + step * k for first, step, count in packed for k in range(count)]


def entry(rank: int, label: str, members: list[int]) -> bytes:
    """What ``rank``, stuck freeing ``label`` among ``members``, appends for its peers."""
    payload = json.dumps({"group": label, "runs": runs(members)}, separators=(",", ":"))
    return entries.entry(rank, payload.encode())


def read(blob: bytes) -> dict[int, tuple[str, list[int]]]:
    """Each stuck rank's ``(label, members)``, from the appended entries."""
    found = {}
    for rank, payload in entries.entries(blob).items():
        said: dict[str, Any] = json.loads(payload)
        found[rank] = (str(said.get("group")), ranks_of(said.get("runs", [])))
    return found


def closure(
    me: int, members: list[int], found: dict[int, tuple[str, list[int]]]
) -> tuple[list[int], dict[int, str]]:
    """The ranks a stuck free waits for that said nothing, following peers stuck elsewhere;
    and each peer's group it is stuck in."""
    waiting = [r for r in members if r != me]
    seen = {me}
    missing, elsewhere = [], {}
    while waiting:
        rank = waiting.pop()
        if rank in seen:
            continue
        seen.add(rank)
        said = found.get(rank)
        if said is None:
            missing.append(rank)
            continue
        elsewhere[rank] = said[0]
        waiting.extend(said[1])
    return sorted(missing), elsewhere
