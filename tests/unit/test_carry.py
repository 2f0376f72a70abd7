"""What WORLD's swap cannot carry for a group the package did not make (``groups.world.carry``).

torch 2.13 and 2.14 keep a group's state in ``_world`` maps the swap carries whole; a group
whose backend is a torchcomms communicator would still be finalized with WORLD (torch finalizes
every one in ``_world.comms``). torchcomms is not installed here, so torch's ``_BackendWrapper``
is stood in for by a class of the test's, and the group by an object that answers what
``device_backends`` asks (``_device_types``, ``_get_backend``): the one fake in this file.
The rank tests (``tests/ranks/test_adoption_concert.py``) show the rest on real groups.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.distributed import distributed_c10d as c10d

from reloadpg_autopatch.groups.world import carry

pytestmark = pytest.mark.unit


class _Comm:
    """Stands for torchcomms' ``_BackendWrapper``."""


class _Group:
    def __init__(self, backend: Any, name: str) -> None:
        self._device_types = [torch.device("cpu")]
        self._backend = backend
        self.group_name = name

    def _get_backend(self, device: Any) -> Any:
        return self._backend


def test_a_group_on_a_torchcomms_communicator_is_named_and_others_are_not(monkeypatch) -> None:
    monkeypatch.setattr(c10d, "_BackendWrapper", _Comm, raising=False)
    lines = carry.obstacles([_Group(_Comm(), "weights"), _Group(object(), "plain")])
    assert len(lines) == 1, lines
    assert lines[0].startswith("group 'weights': its backend is a torchcomms communicator")
    assert "_world.comms" in lines[0]


def test_without_torchcomms_nothing_is_in_the_way(monkeypatch) -> None:
    monkeypatch.delattr(c10d, "_BackendWrapper", raising=False)
    assert carry.obstacles([_Group(_Comm(), "weights")]) == []


@pytest.mark.parametrize("swap", [True, False])
def test_the_doctor_lists_a_group_left_alone_and_says_where_the_next_destroy_refuses_it(
    monkeypatch, swap: bool
) -> None:
    """WORLD's room tells the doctor each group left alone, and that the next destroy will
    refuse one this torch would reach anyway, where WORLD's swap runs (registered with a swap)."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from reloadpg_autopatch.groups.store import channel
    from reloadpg_autopatch.groups.world import facts

    monkeypatch.setattr(c10d, "_BackendWrapper", _Comm, raising=False)
    group = _Group(_Comm(), "weights")
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(carry, "left_alone", lambda: [group])
    monkeypatch.setattr(channel, "registration", lambda: SimpleNamespace(swap=swap))
    listed, problems = facts.left_alone()
    assert [(entry["name"], entry["why"]) for entry in listed] == [("weights", carry.OUTSIDE)]
    (obstacle,) = carry.obstacles([group])
    refused = [f"the next destroy_process_groups() will refuse: {obstacle}"]
    assert problems == (refused if swap else [])
