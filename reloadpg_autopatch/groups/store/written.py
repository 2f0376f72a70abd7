"""What torch writes through the stores the package hands it, recorded so that each rank
deletes its own.

torch never deletes the keys of a group's creation (gloo's addresses, NCCL's unique id, a
reconfigure's handles). A reload creates groups again under keys of its cycle, so unless
someone deletes them the store grows by about a key per member of each group per cycle. If one
rank deleted them all, it would list the store and delete about one key per member of every
group of the world: O(N) work on one rank at every destroy (80,000 deletes at 4,096 ranks with
20 groups each). Instead, every creation the package makes goes through a ``Recording`` store,
which writes under the creation's prefix and notes each key this rank wrote
(``channel.wrote``); at the next cycle's first round, when every rank has finished the
cycle before, each rank deletes the keys it wrote: its own share, proportional to the groups
it is a member of.

A group rebuilt in place (torch 2.14's ``reconfigure``) writes its handshake through the store
the group was created with, which the package does not hand it. For gloo the keys are known
(its reconfigure namespaces them under ``reconfigure/<uuid>``: the new rank 0 claims the uuid
in ``claimed`` and every member publishes its address as ``<context>/<rank>``): each member
notes its own. For any other backend the rebuild is marked, and the member of rank 0 deletes
what holds the mark after one listing of the store per cycle (``sweep.sweep_marked``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ..backends import device_backends
from . import channel


class Recording(dist.Store):
    """``target`` under ``prefix``, noting every key this rank writes (to delete it later).

    torch hands the store of a creation to C++ (gloo, NCCL), which calls back through torch's
    trampoline for Python stores. ``target`` is the world's store as the rounds use it
    (``channel.base_store``): one that can delete, even over a Python store of the program.
    ``prefix`` is set anew at each step that creates (``recording``).
    """

    def __init__(self, target: Any, prefix: str) -> None:
        super().__init__()
        self.target = target
        self.prefix = prefix

    def _wrote(self, key: str) -> str:
        full = self.prefix + key
        channel.wrote(self.target, full)
        return full

    def set(self, key: str, value: Any) -> None:
        self.target.set(self._wrote(key), value)

    def add(self, key: str, value: int) -> int:
        return self.target.add(self._wrote(key), value)

    def append(self, key: str, value: Any) -> None:
        self.target.append(self._wrote(key), value)

    def compare_set(self, key: str, expected: Any, desired: Any) -> Any:
        return self.target.compare_set(self._wrote(key), expected, desired)

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        self.target.multi_set([self._wrote(k) for k in keys], values)

    def get(self, key: str) -> Any:
        return self.target.get(self.prefix + key)

    def multi_get(self, keys: list[str]) -> Any:
        return self.target.multi_get([self.prefix + k for k in keys])

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        keys = [self.prefix + k for k in keys]
        if timeout is None:
            self.target.wait(keys)
        else:
            self.target.wait(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        return self.target.check([self.prefix + k for k in keys])

    def delete_key(self, key: str) -> bool:
        return self.target.delete_key(self.prefix + key)

    def num_keys(self) -> int:
        return self.target.num_keys()

    def has_extended_api(self) -> bool:
        return True


#: Every recording store made, by target and role: never freed. torch's C++ holds only the C++
#: half of a Python store; were the Python object collected while a group still holds it, the
#: group's next store call would reach a pure virtual function. One per world and role, so the
#: process holds a few, however many cycles it runs.
_KEPT: dict[tuple[int, str], Recording] = {}


def recording(role: str, prefix: str) -> Recording:
    """This world's recording store for ``role`` (``"world"``: WORLD's swaps; ``"groups"``: a
    reload's creations), writing under ``prefix`` from now on.

    One object serves every cycle of a world: a group it created writes and reads under the
    prefix of the step that runs when it does (NCCL's lazy unique id, at the group's first
    collective). Every rank changes the prefix at the same step of its program, before any
    rank can meet it in a rendezvous of torch's after that step, so the members of a
    rendezvous always agree on the prefix.
    """
    target = channel.base_store()
    store = _KEPT.get((id(target), role))
    if store is None or store.target is not target:
        store = _KEPT[(id(target), role)] = Recording(target, prefix)
    store.prefix = prefix
    return store


#: How gloo's reconfigure names its keys under the group's store of each device (torch 2.14).
GLOO_CLAIM = "reconfigure/{uuid}/claimed"
GLOO_ADDRESS = "reconfigure/{uuid}/{context}/{rank}"


def _gloo_contexts(backend: Any) -> int | None:
    """How many gloo contexts (one per device it was given) ``backend`` connects; None: not
    gloo's."""
    if not isinstance(backend, dist.ProcessGroupGloo):
        return None
    devices = getattr(getattr(backend, "options", None), "_devices", None)
    return len(devices) if devices else 1


def reconfigured(group: Any, store: Any, uuid: int) -> None:
    """``group`` was rebuilt in place under ``uuid``: note the keys this rank wrote, or mark the
    rebuild for the member of rank 0 to sweep (a backend whose keys are not known)."""
    rank = group.rank()
    seen: set[int] = set()
    for _device, backend in device_backends(group):
        if id(backend) in seen:
            continue
        seen.add(id(backend))
        contexts = _gloo_contexts(backend)
        if contexts is None:
            if rank == 0:
                channel.mark(f"reconfigure/{uuid}/")
            continue
        # torch gives each backend a store under its device's name; gloo's, which may also
        # serve cuda, is made for cpu, which it always serves.
        own = dist.PrefixStore("cpu/", store)
        keys = [GLOO_ADDRESS.format(uuid=uuid, context=c, rank=rank) for c in range(contexts)]
        for key in keys + ([GLOO_CLAIM.format(uuid=uuid)] if rank == 0 else []):
            channel.wrote(own, key)
