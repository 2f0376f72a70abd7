"""The sweep of the store (``groups/sweep.py``) on a real torch store, whose own
``check()`` says which keys remain.

After cycle ``c``'s first round on rank 0, a fast rank may already have counted into the next
cycle's first round (a destroy refused on every rank ends its cycle without a reload), so the
keys of cycle ``c + 1`` are live: only those of earlier cycles, and of cycles no rank of this
world can have reached yet (an earlier world's, on a reused store), go.
"""

from __future__ import annotations

import torch.distributed as dist

from reloadpg_autopatch.groups.store import sweep
from tests.support.stores import Forwarding


def _store(*keys: str) -> dist.Store:
    store = dist.PrefixStore("0/", dist.HashStore())  # as torch puts WORLD's store
    for key in keys:
        store.set(key, b"x")
    return store


def test_the_sweep_keeps_this_cycle_and_the_next_and_deletes_the_others() -> None:
    keys = {
        cycle: f"reloadpg_autopatch/{cycle}/0/agreement/arrived" for cycle in (1, 4, 5, 6, 7, 12)
    }
    theirs = ["reloadpg_autopatch/probe", "0//cpu//0/1", "other/reloadpg_autopatch/3/0/x"]
    store = _store(*keys.values(), *theirs)
    assert sweep.sweep(store, 5) == 4
    remaining = {cycle for cycle, key in keys.items() if store.check([key])}
    assert remaining == {5, 6}
    assert all(store.check([key]) for key in theirs)


def test_a_store_that_cannot_list_keeps_its_keys_and_the_sweep_does_not_raise() -> None:
    class Unlisted:
        def list_keys(self) -> list[str]:
            raise RuntimeError("not implemented")

    assert sweep.sweep(Unlisted(), 3) == 0


def test_through_lists_and_deletes_a_python_stores_keys_under_the_prefix() -> None:
    """torch's ``PrefixStore`` over a Python ``Store`` can neither list nor delete; ``Through``
    does both on the inner store, under the prefix: the listing is the prefix store's own view
    (the prefix taken off, nothing outside it), and the sweep deletes there."""

    custom = Forwarding(dist.HashStore())
    prefixed = dist.PrefixStore("0", custom)  # torch joins prefix and key with a "/"
    for key in ("reloadpg_autopatch/3/0/x", "reloadpg_autopatch/9/0/x", "mine"):
        prefixed.set(key, b"x")
    custom.set("elsewhere/reloadpg_autopatch/3/0/x", b"x")
    through = sweep.Through(prefixed, custom, "0")
    assert sorted(through.list_keys()) == [
        "mine",
        "reloadpg_autopatch/3/0/x",
        "reloadpg_autopatch/9/0/x",
    ]
    assert sweep.sweep(through, 9) == 1
    assert custom.check(["0/reloadpg_autopatch/9/0/x", "0/mine"])
    assert not custom.check(["0/reloadpg_autopatch/3/0/x"])
    assert custom.check(["elsewhere/reloadpg_autopatch/3/0/x"])


def test_the_marks_of_every_rebuild_are_swept_after_one_listing() -> None:
    """Native mode's fallback: however many groups were rebuilt, one listing finds the keys of
    every rebuild's ``reconfigure/<uuid>/`` (and only those) to delete."""

    class Listed(Forwarding):
        listings = 0

        def list_keys(self):
            Listed.listings += 1
            return super().list_keys()

    store = Listed(dist.HashStore())
    uuids = [11, 22, 33, 44]
    for uuid in uuids:
        for key in (f"0/cpu//reconfigure/{uuid}/0/0", f"0/cpu//reconfigure/{uuid}/claimed"):
            store.set(key, b"x")
    store.set("0/cpu//reconfigure/111/0/0", b"x")  # another rebuild's, whose uuid holds 11
    markers = [f"reconfigure/{uuid}/" for uuid in uuids[:3]]
    assert sweep.sweep_marked(store, markers) == 6
    assert Listed.listings == 1
    assert sorted(store.list_keys()) == [
        "0/cpu//reconfigure/111/0/0",
        "0/cpu//reconfigure/44/0/0",
        "0/cpu//reconfigure/44/claimed",
    ]


def test_recording_notes_each_key_this_rank_writes_under_its_prefix() -> None:
    """What torch writes through a creation's store is noted for this rank to delete (every
    writing call), with the prefix the store gives it; what it only reads is not."""
    from reloadpg_autopatch.groups import process
    from reloadpg_autopatch.groups.store import written

    target = dist.HashStore()
    rounds = process.current().rounds
    rounds.written = []
    store = written.Recording(target, "reloadpg_autopatch/3/1/groups/t/")
    store.set("1//cpu//0/0", b"a")
    store.add("1//barrier", 1)
    store.append("1//log", b"x")
    store.compare_set("1//claimed", "", b"me")
    store.multi_set(["1//m0", "1//m1"], [b"0", b"1"])
    assert store.get("1//cpu//0/0") == b"a"
    store.wait(["1//cpu//0/0"])
    assert store.check(["1//m1"])
    noted = [key for held, key in rounds.written if held is target]
    prefix = "reloadpg_autopatch/3/1/groups/t/"
    assert noted == [
        prefix + k for k in ("1//cpu//0/0", "1//barrier", "1//log", "1//claimed", "1//m0", "1//m1")
    ]
    assert all(target.check([key]) for key in noted)
    assert all(sweep.delete(target, key) for key in noted)
    assert not any(target.check([key]) for key in noted)
    rounds.written = []
