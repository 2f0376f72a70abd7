"""``ReloadableProcessGroup``: a ``ProcessGroup`` whose native group can be destroyed and rebuilt.

Megatron caches group objects in module globals for the whole run, so the object it holds must
survive a destroy/reload cycle while the communicator inside it does not. The wrapper holds the
native group in ``.group`` (slime's attribute name, which foreign code relies on) and forwards
every method and property of the installed torch's ``ProcessGroup``, discovered at import time.
That matters because code that reaches torch with the wrapper itself (a binding made before the
patch) goes through the ``PyProcessGroup`` trampoline, which calls whatever Python method has the
name torch uses today: torch 2.13 renamed collectives to ``all_gather_single`` and friends, and a
hand-kept method list that lacks them fails with "No backend type associated with device type".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ....errors import ReloadPGError
from ... import aliases, guard, names, pools, registry
from ...record import Record, State
from .forwarders import install

logger = logging.getLogger("reloadpg_autopatch")

_NativeProcessGroup = dist.ProcessGroup

#: torch compiles batched p2p (``batch_p2p_ops``, which needs C++ backends) only when asked.
_P2P_COMPILATION = os.environ.get("TORCHDYNAMO_ENABLE_P2P_COMPILATION", "0") not in ("", "0")


class ReloadableProcessGroup(_NativeProcessGroup):
    """A process group that stays valid across ``destroy_process_groups``/``reload_process_groups``.

    ``group`` is the native ``ProcessGroup`` (``None`` while destroyed). Every method and
    property of the installed torch's ``ProcessGroup`` forwards to it; using the wrapper while
    destroyed raises a ``RuntimeError`` naming the group and the fix.

    Instances are normally made by the patched ``torch.distributed.new_group``. Building one
    directly registers it for reload with ``group_args``/``group_kwargs`` (default:
    ``ranks=ranks``), which reload passes to torch's ``new_group`` on this rank, under the
    group's current name.
    """

    # ``_fast`` is what the collectives read: a slot (7 ns instead of 19 ns for a dict
    # attribute), read by the generated wrappers and the forwarders on every call. It holds the
    # native group while nothing needs to run before a call on it, and None otherwise
    # (destroyed, or armed by the memory guard after a reload): then the slow path decides.
    # ``.group`` (slime's public name) always reads the native group. For the same reason
    # there is no __getattr__ fallback (it would slow every attribute read by ~25 ns): native
    # groups take no attributes beyond their class's members, all forwarded below.
    __slots__ = ("__dict__", "_fast", "_native")

    def __init__(
        self,
        group: Any,
        ranks: Sequence[int] | None = None,
        group_args: Sequence[Any] = (),
        group_kwargs: dict[str, Any] | None = None,
        *,
        _record: Record | None = None,
    ) -> None:
        if type(group) is not _NativeProcessGroup:
            raise TypeError(
                "ReloadableProcessGroup needs a native torch.distributed.ProcessGroup, "
                f"got {type(group).__name__}"
            )
        super().__init__(group.rank(), group.size())
        self.group = group
        if ranks is None:
            ranks = dist.get_process_group_ranks(group)
        self.ranks = list(ranks)
        if _record is None:
            from .way import WRAPPER  # not at import: the patch loads this module alone

            if not group_args and not group_kwargs:
                group_kwargs = {"ranks": self.ranks}
            _record = registry.add(
                group_args, group_kwargs or {}, group.group_name, State.LIVE, WRAPPER
            )
            _record.native = group
            registry.belong_to(dist.GroupMember.WORLD)
        self._record = _record
        _record.attach(self)
        self.mirror_backends()
        if not _OPAQUE_MEMBERS_REGISTERED:
            _register_opaque_members()
        _record.alias = aliases.link(self, group)

    @property
    def group(self) -> Any:
        """The native group serving this one now (None while destroyed)."""
        return self._native

    @group.setter
    def group(self, native: Any) -> None:
        self._native = native
        self._fast = native
        self.__dict__.pop("_armed", None)

    def arm(self, device: Any) -> None:
        """Run the memory guard for ``device`` before the next collective on this group."""
        if self._native is not None:
            self.__dict__["_armed"] = device
            self._fast = None

    def live(self, what: str, local: bool = False) -> Any:
        """The native group for a call that missed the fast slot: guard first, or the error.

        ``local``: the call does not communicate (``rank()``, ``size()``...): a group that
        sleeps in suspend mode still answers it from its kept native group.
        """
        native = self._native
        if native is None:
            record = self._record
            if local and record.state in (State.SUSPENDED, State.BROKEN):
                return record.native
            raise self.destroyed_error(what)
        device = self.__dict__.get("_armed")
        if device is not None:
            if not guard.get_memory_guard().every_call:
                self.__dict__.pop("_armed", None)
                self._fast = native
            guard.check(device, self.describe())
        return native

    def mirror_backends(self) -> None:
        """Give this object's C++ side the native group's backends, when compiled p2p needs it.

        C++ code that resolves a group by name and asks the C++ ``ProcessGroup`` for a backend
        directly (``batch_p2p_ops``, which torch compiles only with
        ``TORCHDYNAMO_ENABLE_P2P_COMPILATION=1``) cannot be answered by a Python method. But a
        backend registered on this object stays registered for the object's life (torch has no
        way to remove one, and a later registration of the same type keeps the first): the
        first incarnation's communicator could never be freed, and a thread blocked in one of
        its collectives would hang until the group's timeout, because the peer's sockets stay
        open. So only a program that opted into compiled p2p pays that.
        """
        inner = self.group
        if inner is None or not _P2P_COMPILATION or self.__dict__.get("_mirrored"):
            return
        self.__dict__["_mirrored"] = True
        types = c10d.Backend.backend_type_map
        for device in inner._device_types:
            backend = inner._get_backend(device)
            kind = types.get(backend.name().lower(), _NativeProcessGroup.BackendType.CUSTOM)
            _NativeProcessGroup._register_backend(self, device, kind, backend)
        default = types.get(inner._get_backend_name().lower())
        if default is not None:
            _NativeProcessGroup._set_default_backend(self, default)

    def _get_backend(self, device: Any) -> Any:
        """The native group's backend for ``device``; memory pools registered on it are kept.

        Megatron registers its NCCL memory pools through ``group._get_backend(device)
        .register_mem_pool(pool)``; the registration dies with the communicator, so the record
        keeps it and reload makes it again on the new backend (``pools.replay``).
        """
        inner = self._fast
        if inner is None:  # a backend is not a collective: a sleeping group still hands it out
            inner = self._live("_get_backend()", local=True)
        backend = _NativeProcessGroup._get_backend(inner, device)
        pools.track(backend, self._record, device)
        return backend

    # slime exposes the creation arguments under this name; keep it for code that reads it.
    @property
    def group_info(self) -> dict[str, Any]:
        return {
            "ranks": list(self.ranks),
            "args": self._record.args,
            "kwargs": dict(self._record.kwargs),
        }

    @property
    def group_name(self) -> str:
        """The group's name, the same for every incarnation; resolving it gives this object."""
        inner = self._kept()
        if inner is None:
            raise self.destroyed_error("property 'group_name'")
        name = inner.group_name
        record = self._record
        if record.published is None:
            names.publish(name, self)
            record.published = self
        return name

    @property
    def is_destroyed(self) -> bool:
        """True between ``destroy_process_groups()`` and ``reload_process_groups()``."""
        return self._native is None

    def describe(self) -> str:
        """A short name for messages, as its way says (a description, else its ranks)."""
        return self._record.way.describe(self._record, self.ranks)

    def sleep(self) -> None:
        """Suspended (torch 2.13): every call that communicates is refused until ``wake()``;
        the native group stays in the record, and its aliases in torch's maps."""
        self.group = None

    def wake(self) -> None:
        self.group = self._record.native

    def _kept(self) -> Any:
        """The native group for what does not communicate: also while it sleeps suspended."""
        native = self._native
        if native is None and self._record.state in (State.SUSPENDED, State.BROKEN):
            return self._record.native
        return native

    def destroyed_error(self, what: str) -> ReloadPGError:
        """The error for using this group while it has no native group (its way's)."""
        return self._record.way.use_error(self._record, self.describe(), what)

    def _live(self, what: str, local: bool = False) -> Any:
        """``live(what)`` for a forwarder whose fast slot was empty.

        torch.compile inlines forwarders and may read only registered members of a group:
        while it traces, the native group is taken as it is (the guard runs on the next eager
        call).
        """
        if torch.compiler.is_compiling():
            native = self._native
            if native is None:
                raise self.destroyed_error(f"{what}, in compiled code")
            return native
        return self.live(what, local)

    def __repr__(self) -> str:
        return f"<{self.describe()} {self._record.state.value}>"

    # Groups are handles to communicators: copying one must give the same group, as it does
    # for the native class (Megatron deep-copies configs that hold groups).
    def __copy__(self) -> ReloadableProcessGroup:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> ReloadableProcessGroup:
        return self


_OPAQUE_MEMBERS_REGISTERED = False


def _register_opaque_members() -> None:
    """Let torch.compile read ``.group`` of a reloadable group, as it reads a group's name.

    torch registers ``ProcessGroup`` as an opaque type whose listed members Dynamo may read
    (``group_name``, ``size``...). This subclass inherits the list, which lacks ``group``: the
    native group a compiled ``P2POp`` construction unwraps to. Done on the first group (not at
    import: torch is still importing when the patch loads this module).
    """
    global _OPAQUE_MEMBERS_REGISTERED
    _OPAQUE_MEMBERS_REGISTERED = True
    try:
        from torch._library import opaque_object
        from torch.distributed import device_mesh
    except ImportError:  # a torch without opaque types: Dynamo does not ask
        return
    register = getattr(device_mesh, "_register_distributed_opaque_types", None)
    if register is not None:
        register()  # torch's own, done lazily: ProcessGroup's members first
    info = opaque_object.get_opaque_obj_info(ReloadableProcessGroup)
    if info is None:  # torch 2.11: ProcessGroup is no opaque type, so Dynamo reads no list
        return
    members = dict(info.members)
    members["group"] = opaque_object.MemberType.USE_REAL
    members["_fast"] = opaque_object.MemberType.USE_REAL
    members["_native"] = opaque_object.MemberType.USE_REAL
    opaque_object.register_opaque_type(ReloadableProcessGroup, typ="reference", members=members)


FORWARDED_METHODS, FORWARDED_PROPERTIES = install(ReloadableProcessGroup)


def forwarding_report() -> dict[str, list[str]]:
    """Which ``ProcessGroup`` members of this torch the wrapper forwards, and which it leaves."""
    members = [n for n in dir(_NativeProcessGroup) if not n.startswith("__")]
    forwarded = set(FORWARDED_METHODS) | set(FORWARDED_PROPERTIES)
    return {
        "methods": sorted(FORWARDED_METHODS),
        "properties": sorted(FORWARDED_PROPERTIES),
        "inherited": sorted(n for n in members if n not in forwarded),
    }
