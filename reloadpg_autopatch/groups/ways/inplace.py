"""In place: the same ``ProcessGroup`` object, its communicator released and rebuilt.

torch 2.14's ``ProcessGroup.reconfigure`` rebuilds a group's communicator inside the object the
program already holds, from one opaque handle per member (``get_reconfigure_handle``) and a
value that must be fresh on every (re)initialization. The members exchange their handles
through the store, under keys of this cycle, and every member derives the same fresh value
from the cycle, the reload's token (the same on every rank, new in every world) and the
group's name. So the program holds torch's own group before and after every reload, and
nothing stands in for it; a group that cannot be rebuilt so is refused loudly in native mode.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ..._env import MODE_ENV
from ..._originals import original
from ...errors import ModeRefusedError
from .. import backends, frees, guard, memory, process
from ..agreement import KEEP
from ..backends import device_backends
from ..decisions import DestroyFacts, DestroyStep, ReloadFacts, ReloadStep
from ..record import Record, State
from ..runs import DestroyRun, ReloadRun
from ..store import channel, rounds, written
from .base import Way


def torch_can_reconfigure() -> bool:
    """Whether the installed torch rebuilds a group in place (``ProcessGroup.reconfigure``)."""
    return hasattr(dist.ProcessGroup, "reconfigure") and hasattr(
        dist.ProcessGroup, "get_reconfigure_handle"
    )


def in_place_refusal(group: Any) -> str | None:
    """Why ``group`` cannot be reloaded in place, or None when it can."""
    if not torch_can_reconfigure():
        return f"torch {torch.__version__} has no ProcessGroup.reconfigure (torch 2.14 and later)"
    backends = {id(backend): backend for _device, backend in device_backends(group)}
    if len(backends) > 1:
        names = sorted({type(b).__name__ for b in backends.values()})
        return (
            f"it has several backends ({', '.join(names)}), and torch reconfigures a group with "
            "one backend only"
        )
    # torch's debug wrapper says so by what it holds (torch peels it by ``wrapped_pg`` too).
    if any(getattr(b, "wrapped_pg", None) is not None for b in backends.values()):
        return (
            "TORCH_DISTRIBUTED_DEBUG=DETAIL wraps its backend in torch's _ProcessGroupWrapper "
            "(which checks every collective's arguments across ranks), and that wrapper cannot "
            "reconfigure; unset TORCH_DISTRIBUTED_DEBUG (or set it to INFO) for native mode"
        )
    try:
        supported = bool(getattr(group, "supports_reconfigure", False))
    except RuntimeError as error:  # torch refuses to answer for some groups
        return str(error)
    if not supported:
        name = next(iter(backends.values()), None)
        label = type(name).__name__ if name is not None else "its backend"
        return f"{label} does not support reconfigure (it answers supports_reconfigure=False)"
    return None


def release(group: Any, label: str) -> None:
    """Free the group's communicator; the object stays torch's registered group."""
    frees.shutdown(group, label)


def _uuid(holder: process.ProcessState, name: str) -> int:
    digest = hashlib.sha256(holder.key("reload", "uuid", channel.token(), name).encode()).digest()
    return int.from_bytes(digest[:7], "big")  # fits the int64 torch takes


def rebuild(group: Any, name: str, timeout: timedelta | None) -> None:
    """Reconfigure ``group`` in place with its members' fresh handles (every member calls)."""
    holder = process.current()
    bound = channel.world_timeout()
    # One key written and one read per member; the last member to arrive combines them.
    handles = [
        handle.decode()
        for handle in rounds.exchange(
            channel.base_store(),
            holder.key("reload", "handle", channel.token(), name),
            group.rank(),
            group.size(),
            group.get_reconfigure_handle(),
            # A missing member fails this within WORLD's timeout, not the group's own.
            timeout=min(timeout, bound) if timeout else bound,
            step=f"reload: handles of group {name!r}",
            cycle=channel.where("reload"),
        )
    ]
    uuid = _uuid(holder, name)
    work = original("_reconfigure")(uuid, handles, group=group, timeout=timeout)
    if work is not None:
        work.wait()
    # torch leaves its handshake under the group's own store: this rank deletes its share later
    written.reconfigured(group, c10d._world.pg_map[group][1], uuid)


class InPlace(Way):
    """Torch's own group object, its communicator shut down and reconfigured (torch 2.14)."""

    name: ClassVar[str] = "in place"
    torch_object: ClassVar[bool] = True
    in_place: ClassVar[bool] = True

    def refusal(self, group: Any) -> str | None:
        return in_place_refusal(group)

    def strict_error(self, name: str, refusal: str) -> ModeRefusedError:
        return ModeRefusedError(
            f"{MODE_ENV}=native (or set_reload_mode('native')) but group {name!r} cannot be "
            f"reloaded in place: {refusal}; use mode 'auto' to reload such groups behind a "
            "wrapper, or 'wrapper' for all"
        )

    def available(self) -> bool:
        return torch_can_reconfigure()

    def explain(self) -> str:
        return "in place (ProcessGroup.reconfigure)"

    def cannot(self, why: str) -> str:
        return f" ({why})"

    def problem(self, backend: str, why: str) -> str:
        return f"native mode cannot reload {backend} groups: {why}"

    # ---- decisions ----

    def sleep_step(self, facts: DestroyFacts) -> DestroyStep:
        return DestroyStep.FREE_IN_PLACE

    def wake_step(self, facts: ReloadFacts) -> ReloadStep:
        return self.in_place_wake_step(facts)

    def elsewhere_step(self, facts: ReloadFacts) -> ReloadStep:
        return ReloadStep.REFUSE_RELEASED_HERE  # only a member reloads in place: released here

    def made_while_asleep_step(self, facts: ReloadFacts) -> ReloadStep:
        return ReloadStep.REFUSE_TORN_DOWN if facts.torn_down else ReloadStep.NOTHING

    def creates_nothing(self, record: Record) -> bool:
        return True

    def common_ways(self) -> str:
        return KEEP  # torch's own object: never behind a wrapper

    # ---- the steps ----

    def free(self, record: Record, run: DestroyRun) -> None:
        record.timeout = backends.group_timeout(record.native)
        record.device = memory.device_of(record.native)
        release(record.native, frees.label(record.name, record.kwargs))
        record.move(State.DESTROYED)
        self.note(run, "destroyed", record)

    def rebuild(self, record: Record, run: ReloadRun) -> None:
        if record.device is not None:
            guard.check(record.device, f"group {record.name!r}")
        rebuild(record.native, record.name, record.timeout)
        record.move(State.LIVE)
        run.rebuilt.append(record.native)
        self.note(run, "rebuilt", record)


IN_PLACE = InPlace()
