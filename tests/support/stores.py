"""A Python ``Store`` that forwards every call to a store of torch's: the custom store a program
may hand ``init_process_group`` (which torch puts under a ``PrefixStore``), and the base of the
tests' stores that watch what is read. ``forget_torchs_keys`` deletes what torch's own
rendezvous left on a store, for the tests that start a second WORLD on it."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


class Forwarding(dist.Store):
    """Every call goes to ``inner``; subclasses override what they watch."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def set(self, key, value):
        self.inner.set(key, value)

    def get(self, key):
        return self.inner.get(key)

    def add(self, key, value):
        return self.inner.add(key, value)

    def compare_set(self, key, expected, desired):
        return self.inner.compare_set(key, expected, desired)

    def wait(self, keys, timeout=None):
        return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    def check(self, keys):
        return self.inner.check(keys)

    def multi_get(self, keys):
        return self.inner.multi_get(keys)

    def multi_set(self, keys, values):
        self.inner.multi_set(keys, values)

    def delete_key(self, key):
        return self.inner.delete_key(key)

    def num_keys(self):
        return self.inner.num_keys()

    def list_keys(self):
        return self.inner.list_keys()

    def append(self, key, value):
        self.inner.append(key, value)

    def has_extended_api(self):
        return True


def forget_torchs_keys(store: Any, rank: int, world_size: int) -> None:
    """Delete the keys torch's own rendezvous left (gloo reads a peer's stale address).

    The gate-off control shows that torch itself cannot start a second WORLD on a store that
    still holds the first one's keys when a rank is late. Whatever the package wrote stays.
    """
    import time

    store.add("blind-spots/between", 1)
    while int(store.add("blind-spots/between", 0)) < world_size:
        time.sleep(0.05)
    if rank == 0:
        for key in store.list_keys():
            # torch keeps WORLD's store under WORLD's name ("0/..."): the package's keys
            # sit below that, so they are told apart by their segment, not a prefix.
            if "reloadpg_autopatch/" not in key and not key.startswith("blind-spots/"):
                store.delete_key(key)
        store.set("blind-spots/clean", "1")
    store.wait(["blind-spots/clean"])
