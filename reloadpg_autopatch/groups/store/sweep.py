"""What the store holds that no rank reads any more, deleted: the one-off sweep of a world's
first destroy, and the deletes of each rank's own creation keys.

torch writes the keys of a group's creation (gloo's addresses, a reconfigure's handles) and
never deletes them; the rounds delete their own (``rounds``). A reload creates groups again
under keys of its cycle (``reloadpg_autopatch/<cycle>/...``), and each rank deletes the keys its
own creations wrote (``written``) once every rank has finished that cycle: after the next
cycle's first round (the destroy's agreement). So no rank lists the store or deletes another
rank's keys in the cycles of a world, and a cycle that created nothing deletes nothing. Once
per world, at its first destroy, WORLD's rank 0 deletes every key of ours that belongs to
another cycle than this one and the next (``sweep``): what an earlier world on the same store
left (a world that crashed, or the last cycle of one that ended).

Torch-free, as ``rounds`` is: a store is anything with ``list_keys`` and ``delete_key``. A
store that cannot list (a Python ``Store`` that does not implement it) keeps its keys. torch's
``PrefixStore`` over a Python ``Store`` can neither delete nor list (its trampoline forwards
neither): ``Through`` does both through the inner store, under the prefix.
"""

from __future__ import annotations

import logging
import re
from typing import Any

logger = logging.getLogger("reloadpg_autopatch")

__all__ = ["PREFIX", "Through", "delete", "of_other_cycles", "sweep", "sweep_marked"]

#: Where every key of ours lives (``process.ProcessState.key``).
PREFIX = "reloadpg_autopatch/"
_CYCLE = re.compile(r"^reloadpg_autopatch/(\d+)/")
#: A rebuild's marker in a key (``channel.mark``).
_MARK = re.compile(r"reconfigure/-?\d+/")


class Through:
    """A ``PrefixStore`` whose deletes and listings go to its inner store, under its prefix.

    torch puts WORLD's store under ``PrefixStore(f"{WORLD's name}/", store)``; when ``store``
    is a Python ``Store``, the prefix store's ``delete_key`` and ``list_keys`` raise (torch's
    trampoline for a Python store forwards neither), so every round would leave its keys.
    Everything else goes to the prefix store as it is.
    """

    def __init__(self, store: Any, inner: Any, prefix: str) -> None:
        self.store, self.inner, self.prefix = store, inner, prefix

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def delete_key(self, key: str) -> bool:
        try:
            return bool(self.store.delete_key(key))
        except Exception:  # the trampoline: delete the key the prefix store wrote
            return bool(self.inner.delete_key(f"{self.prefix}/{key}"))

    def list_keys(self) -> list[str]:
        try:
            return list(self.store.list_keys())
        except Exception:
            head = f"{self.prefix}/"
            return [k[len(head) :] for k in self.inner.list_keys() if k.startswith(head)]


def of_other_cycles(keys: list[str], cycle: int) -> list[str]:
    """The keys of ours, among ``keys``, that no rank of this world reads or writes any more.

    Those of ``cycle`` are live, and so are those of the next: a fast rank may have counted
    into the next cycle's first round already (a destroy refused on every rank ends its cycle
    without a reload round), though no further, since that round waits for this rank. Any
    other cycle's are from before, or from an earlier world on the same store.
    """
    return [
        k for k in keys if (found := _CYCLE.match(k)) and int(found[1]) not in (cycle, cycle + 1)
    ]


def _list(store: Any) -> list[str] | None:
    try:
        return [str(key) for key in store.list_keys()]
    except Exception as error:  # a Python store without list_keys, or the store is gone
        logger.debug("cannot list the store's keys to sweep them: %s", error)
        return None


def delete(store: Any, key: str) -> bool:
    """Delete ``key`` (only tidying: a store that cannot, or is gone, keeps it)."""
    try:
        return bool(store.delete_key(key))
    except Exception as error:
        logger.debug("could not delete store key %r: %s", key, error)
        return False


def _delete(store: Any, keys: list[str]) -> int:
    return sum(delete(store, key) for key in keys)


def sweep(store: Any, cycle: int) -> int:
    """Delete the keys of ours in ``store`` that belong to another cycle (``of_other_cycles``);
    how many went."""
    keys = _list(store)
    return 0 if keys is None else _delete(store, of_other_cycles(keys, cycle))


def sweep_marked(store: Any, markers: list[str]) -> int:
    """Delete the keys of ``store`` that hold one of ``markers`` (rebuilds'
    ``reconfigure/<uuid>/``), found in one listing whatever their number (a set lookup each)."""
    keys = _list(store)
    if keys is None:
        return 0
    wanted = set(markers)
    return _delete(store, [k for k in keys if (m := _MARK.search(k)) and m[0] in wanted])
