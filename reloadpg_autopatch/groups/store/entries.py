"""How a store round lays out its entries: every rank's in one key, a read in one round trip.

Torch-free, as ``rounds`` is: a round appends each rank's entry to one key (``entry``), the
last arriver reads them back in one value (``entries``, through ``read``), and an exchange packs
every entry into one result (``pack``/``unpack``). On the error path, ``missing`` names the
ranks whose entry never came.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("reloadpg_autopatch")

#: The value ``read`` compares against: whatever a key holds, ``compare_set`` then returns it.
ANY = b"\x00reloadpg_autopatch: read\x00"


def read(store: Any, key: str) -> bytes:
    """The value of ``key``, which exists: one round trip (``get`` waits for it again first).

    ``compare_set`` returns the current value and changes it only if it equals ``ANY``, into
    ``ANY``: a read, whatever the key holds.
    """
    return bytes(store.compare_set(key, ANY, ANY))


def entry(rank: int, payload: bytes) -> bytes:
    return rank.to_bytes(4, "big") + len(payload).to_bytes(8, "big") + payload


def entries(blob: bytes) -> dict[int, bytes]:
    """The ``entry`` records appended to one key, by rank (a rank twice: its last one)."""
    out, at = {}, 0
    while at + 12 <= len(blob):
        size = int.from_bytes(blob[at + 4 : at + 12], "big")
        out[int.from_bytes(blob[at : at + 4], "big")] = blob[at + 12 : at + 12 + size]
        at += 12 + size
    return out


def missing(store: Any, arrived: str, done: str, world_size: int) -> list[int] | None:
    """The ranks with no entry in ``arrived``; None when the store cannot say (it is gone)."""
    try:
        if store.check([arrived]):
            present = entries(read(store, arrived))
            return [rank for rank in range(world_size) if rank not in present]
        # The entries go once the step completed: then nobody is missing; before, nobody came.
        return [] if store.check([done]) else list(range(world_size))
    except Exception:  # the store itself failed: the caller says so
        return None


def pack(parts: list[bytes]) -> bytes:
    """Length-prefixed concatenation (handles are opaque bytes: no separator is safe)."""
    return b"".join(len(e).to_bytes(8, "big") + e for e in parts)


def unpack(blob: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(blob):
        size = int.from_bytes(blob[at : at + 8], "big")
        out.append(blob[at + 8 : at + 8 + size])
        at += 8 + size
    return out


def tidy(store: Any, *keys: str) -> None:
    """Delete keys nobody reads any more; a store that cannot only keeps them."""
    for key in keys:
        try:
            store.delete_key(key)
        except Exception as error:  # the step itself succeeded: never fail it for this
            logger.debug("could not delete store key %r: %s", key, error)
