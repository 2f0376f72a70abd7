"""torch.compile's opaque-type members for a reloadable group, on torches with and without them.

torch 2.13 and 2.14 register ``ProcessGroup`` as an opaque type with a list of members Dynamo
may read; the package adds ``group`` (and its slots) to that list for its subclass. torch 2.11
registers no such type, and its ``register_opaque_type`` refuses a class that is not an
``OpaqueBase``: there the package must leave the list alone instead of failing the first
reloadable group (found running the demo on torch 2.11.0, the GPU machine's torch).
"""

from __future__ import annotations

from typing import Any

import pytest


def test_no_opaque_processgroup_means_no_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on torch 2.11: no lazy registration of torch's own, ``ProcessGroup`` has no opaque
    info, registering refuses; the first reloadable group's step returns without asking."""
    from torch._library import opaque_object
    from torch.distributed import device_mesh

    from reloadpg_autopatch.groups.ways.wrapper import group as reloadable

    asked: list[Any] = []

    def refuse(cls: Any, **_kwargs: Any) -> None:
        asked.append(cls)
        raise TypeError(f"Opaque type {cls} must subclass torch._opaque_base.OpaqueBase")

    monkeypatch.delattr(device_mesh, "_register_distributed_opaque_types", raising=False)
    monkeypatch.setattr(opaque_object, "get_opaque_obj_info", lambda _cls: None)
    monkeypatch.setattr(opaque_object, "register_opaque_type", refuse)
    monkeypatch.setattr(reloadable, "_OPAQUE_MEMBERS_REGISTERED", False)
    reloadable._register_opaque_members()
    assert asked == []


def test_an_opaque_processgroup_gets_the_members_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on torch 2.13 and 2.14: the subclass is registered with ``ProcessGroup``'s members
    plus ``group``, ``_fast`` and ``_native``, read from the real object."""
    from torch._library import opaque_object
    from torch.distributed import device_mesh

    from reloadpg_autopatch.groups.ways.wrapper import group as reloadable

    class Info:
        members = {"group_name": opaque_object.MemberType.USE_REAL}

    seen: dict[str, Any] = {}

    def register(cls: Any, *, typ: str, members: dict[str, Any], **_more: Any) -> None:
        seen.update(cls=cls, typ=typ, members=members)

    monkeypatch.delattr(device_mesh, "_register_distributed_opaque_types", raising=False)
    monkeypatch.setattr(opaque_object, "get_opaque_obj_info", lambda _cls: Info())
    monkeypatch.setattr(opaque_object, "register_opaque_type", register)
    monkeypatch.setattr(reloadable, "_OPAQUE_MEMBERS_REGISTERED", False)
    reloadable._register_opaque_members()
    assert seen["cls"] is reloadable.ReloadableProcessGroup
    assert seen["typ"] == "reference"
    real = opaque_object.MemberType.USE_REAL
    assert seen["members"] == {"group_name": real, "group": real, "_fast": real, "_native": real}
