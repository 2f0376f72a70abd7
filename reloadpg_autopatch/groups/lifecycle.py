"""Create, destroy, reload and release reloadable groups (and WORLD when registered).

Destroy and reload are collective in the SPMD sense: every rank of WORLD calls them at the same
point of its program, as it calls ``new_group``, though ranks may arrive up to WORLD's timeout
apart. Both are idempotent: a second call in a row changes nothing.

A reload rebuilds, in creation order, every group some rank still holds, and nothing else:
before creating anything, the ranks publish through the store which groups they still hold, so
a group every rank let go of is dropped from the registry on every rank at once, and the
creations stay aligned. Each group is recreated under the name it always had, with keys under a
prefix of this generation (``names``), and gets back its timeout and hooks.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from .._originals import destroy_native, original
from . import (
    aliases,
    faults,
    hooks,
    inplace,
    memory,
    mode,
    names,
    policy,
    pools,
    registry,
    rendezvous,
    report,
    state,
    world,
)
from .backends import device_backends
from .record import Record, State
from .reloadable import ReloadableProcessGroup
from .unwrap import unwrap

logger = logging.getLogger("reloadpg_autopatch")

__all__ = [
    "create",
    "destroy_process_groups",
    "end_world",
    "release",
    "reload_process_groups",
    "reloadable_groups",
    "unwrap",
]

_Native = dist.ProcessGroup


@functools.cache
def _new_group_signature() -> inspect.Signature:
    return inspect.signature(original("new_group"))


def _check_world(holder: state.ProcessState) -> None:
    """End the records of a WORLD the program replaced without telling us."""
    known = holder.known_world
    if known is not None and c10d._world.default_pg is not known:
        logger.info("WORLD was destroyed and replaced behind our back: its groups end")
        end_world()


def create(create_native: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Create a group with ``create_native`` (torch's ``new_group``); record and wrap it.

    Per the wrap policy, the group is returned native, or recorded for reload and wrapped when
    this rank is a member. A creation where this rank is not a member is recorded too: reload
    replays it while a member needs the group, because torch creates groups collectively.
    """
    holder = state.current()
    if threaded_world():
        return create_native(*args, **kwargs)  # ranks are threads: see threaded_world()
    with holder.lock:
        _check_world(holder)
    try:
        arguments = _new_group_signature().bind(*args, **kwargs).arguments
    except TypeError:
        return create_native(*args, **kwargs)  # raises torch's own error
    wrap = dist.is_initialized() and policy.should_wrap(
        arguments.get("ranks"), arguments.get("backend"), world.is_registered()
    )
    if not wrap:
        return create_native(*args, **kwargs)

    # No lock of ours is held here: torch's new_group waits for the other ranks, which may be
    # threads of this process (a threaded world) or need this process to go on.
    def taken() -> set[str]:  # asked only for a hashed (local-sync) name
        with holder.lock:
            return {record.name for record in holder.records}

    with names.observing(taken) as seen:
        native = create_native(*args, **kwargs)
    with holder.lock:
        if holder.known_world is None:
            holder.known_world = c10d._world.default_pg
    if type(native) is _Native:
        try:
            in_place = _reloads_in_place(native)
        except RuntimeError:
            destroy_native(native)
            raise
        record = registry.add(args, kwargs, str(native.group_name), State.LIVE)
        record.native = native
        if in_place:
            record.in_place = True
            mode.copy_as_handle()
            return native
        wrapper = ReloadableProcessGroup(native, None, _record=record)
        if memory.get_memory_guard().every_call:
            memory.arm(wrapper)  # slime's behaviour checks from the first collective on
        return wrapper
    if native is dist.GroupMember.NON_GROUP_MEMBER and seen.last is not None:
        registry.add(args, kwargs, seen.last, State.NON_MEMBER)
    elif native is not None and not isinstance(native, int):
        logger.debug("leaving %s native: new_group returned a custom class", type(native))
    return native


def threaded_world() -> bool:
    """Whether ranks are threads of this process (torch's threaded process groups).

    torch's ``MultiThreadedTestCase`` replaces ``_world`` with one world per thread. This
    package's state is per process, so there groups stay torch's own and destroy and reload
    have nothing to do: the gate changes nothing, as with the gate off.
    """
    return type(c10d._world) is not c10d._World


def _reloads_in_place(native: Any) -> bool:
    """Whether a new group reloads in place (the mode, and a WORLD that is not swapped)."""
    if not mode.reloads_in_place(native):
        return False
    if world.needs_swap():
        if mode.get_reload_mode() == "native":
            raise RuntimeError(
                f"group {native.group_name!r} cannot be reloaded in place: WORLD is registered "
                "and swapped for a temporary WORLD on destroy, which destroys every group; "
                "register WORLD in native mode too, or use mode 'auto'"
            )
        return False
    return True


def _serve(record: Record, native: Any) -> None:
    """``native`` now serves the record's group: the wrapper and torch's maps point at it."""
    record.set_native(native)
    wrapper = record.wrapper
    if wrapper is not None:
        wrapper.mirror_backends()
        record.alias = aliases.link(wrapper, native)
        if record.keep is not None:  # its name was handed out: it resolves to the wrapper
            names.publish(record.name, wrapper)


def _unserve(record: Record, destroy: bool) -> None:
    """Take the record's native group away (destroying it first when ``destroy``)."""
    aliases.unlink(record.alias)
    record.alias = None
    if destroy and record.native is not None:
        if record.hooks:
            pools.release(record, f"group {record.name!r}")
        destroy_native(record.native)
    record.set_native(None)


def _drop_if_abandoned(record: Record) -> None:
    """A member record whose wrapper the program dropped is released.

    A group reloaded in place is never seen dropped: torch's own maps hold it.
    """
    if record.in_place or not record.member:
        return
    if record.wrapper is None and record.state in (State.LIVE, State.DESTROYED):
        _unserve(record, destroy=record.state is State.LIVE)
        record.move(State.RELEASED)


def _nothing_to_do(holder: state.ProcessState, step: str) -> bool:
    """Whether this process holds no group that ``step`` could concern.

    A forked child in its parent's WORLD holds none (taking part would use the parent's store
    through an inherited socket, and wait for ranks that wait for the parent); nor does a
    threaded world (``threaded_world``).
    """
    if holder.in_parents_world:
        logger.debug("%s() in a forked child: its groups belong to the parent", step)
        return True
    if threaded_world():
        logger.debug("%s() with ranks as threads: their groups are torch's own", step)
        return True
    return False


@contextlib.contextmanager
def _stepping(holder: state.ProcessState, step: str) -> Iterator[None]:
    """One destroy or reload at a time in this process, without holding a lock across it.

    The step waits for the other ranks (store syncs, group creations); a lock held all that
    time would block every other thread of this process that needs one, among them threads
    whose progress the other ranks wait for. The lock guards the flag only.
    """
    with holder.lock:
        running = holder.step
        if running is not None:
            raise RuntimeError(
                f"{step}() was called while {running}() is running in another thread of this "
                "process; destroy and reload are steps of the whole program: call them from "
                "one thread, after the other has returned"
            )
        holder.step = step
    try:
        yield
    finally:
        holder.step = None


def _destroy_world() -> None:
    original("destroy_process_group")()


def _concerned(holder: state.ProcessState) -> list[Any]:
    """The groups a destroy frees on this rank, WORLD first, then in creation order."""
    out = []
    registered = holder.world
    if registered is not None and (registered.swap or registered.in_place):
        out.append(c10d._world.default_pg)
    for record in holder.records:
        held = record.held
        if record.state is State.LIVE and record.member and held is not None:
            out.append(held)
    return out


def destroy_process_groups() -> None:
    """Free the communicators of every reloadable group; the group objects stay valid.

    With WORLD registered (``register_default_process_group``) and on an accelerator backend,
    WORLD is replaced by a temporary CPU WORLD after the ranks have synchronised. Reload hooks
    (``add_reload_hook``) run first; the cycle report (``last_cycle_report``) records the step.
    """
    started = time.perf_counter()
    holder = state.current()
    if _nothing_to_do(holder, "destroy_process_groups"):
        return
    failures: list[tuple[str, BaseException]] = []
    with _stepping(holder, "destroy_process_groups"):
        _check_world(holder)
        first = not holder.asleep
        swapping = False
        part = report.StepReport()
        cycle = None
        if first:
            cycle = report.begin((holder.generation + 2) // 2, holder.epoch)
            cycle.destroy = part
            cycle.measure("before_destroy")
            with part.phase("hooks"):
                failures = hooks.run("before_destroy", _concerned(holder))
            holder.asleep = True
            holder.generation += 1
            swapping = world.needs_swap()
            # Every rank has finished every creation before any rank frees one: gloo closes a
            # group's sockets under a peer still in that group's handshake ("Connection
            # closed by peer"), and a group created just before the destroy may be one.
            if dist.is_initialized():  # before init there is nothing to destroy, nor a store
                with part.phase("sync"):
                    world.sync("destroy")
        destroyed = []
        with part.phase("destroy"):
            for record in reversed(list(holder.records)):
                _drop_if_abandoned(record)
                if record.state is State.LIVE:
                    record.timeout = world.group_timeout(record.native)
                    if record.in_place:
                        record.device = memory.device_of(record.native)
                        inplace.release(record.native)
                    else:
                        _unserve(record, destroy=True)
                    record.move(State.DESTROYED)
                    destroyed.append(str(record.name))
        if swapping:
            with part.phase("swap"):
                world.swap_out(_destroy_world)
        elif first:
            world.release_in_place()
        for record in holder.records:
            if record.state is State.DESTROYED and record.keep is not None:
                # torch unregistered the name with the native group: whatever resolves it
                # while destroyed (functional collectives, DTensor, a compiled graph) must
                # get the group that says to reload, not "could not resolve".
                names.publish(record.name, record.keep)
    part.total_ms = (time.perf_counter() - started) * 1e3
    part.groups["destroyed"] = destroyed[::-1]
    if cycle is None:
        logger.info("destroyed %d more process groups in %.1f ms", len(destroyed), part.total_ms)
        return
    cycle.measure("after_destroy")
    report.log(cycle, "destroy")
    if failures:
        raise hooks.error_for("before_destroy", failures)


class Agreement:
    """What every rank learns, before a reload creates anything, about every group."""

    def __init__(self, payloads: list[dict[str, Any]]) -> None:
        #: Groups some rank still holds: they are rebuilt, the others are forgotten.
        self.needed = {name for p in payloads for name in p["held"]}
        #: Groups reloaded in place: their non-members have nothing to create.
        self.in_place = {name for p in payloads for name in p["in_place"]}
        #: Groups reloaded in place that a member released: they cannot be rebuilt.
        self.released_in_place = {name for p in payloads for name in p["released_in_place"]}
        #: Whether some rank takes part in creating a group it released (and frees it after).
        self.takes_part = any(p["takes_part"] for p in payloads)


def _agree(holder: state.ProcessState) -> Agreement:
    """Every rank publishes one entry in the store and reads one merged entry: one round trip.

    The last rank to arrive merges the N entries (``rendezvous.agree``), so each rank makes
    O(1) store operations, not N reads. Every rank gets the same answers, so every rank makes
    the same creations in the same order, and skips the same ones.
    """
    held, in_place, released_in_place, takes_part = [], [], [], False
    for record in list(holder.records):
        _drop_if_abandoned(record)
        if record.member and record.state in (State.LIVE, State.DESTROYED):
            held.append(record.name)
            if record.in_place:
                in_place.append(record.name)
        elif record.state is State.RELEASED and record.member:
            takes_part = True
            if record.in_place:
                released_in_place.append(record.name)
    mine = {
        "held": held,
        "in_place": in_place,
        "released_in_place": released_in_place,
        "takes_part": takes_part,
    }
    # The last rank to arrive merges the entries (unions, names packed as runs): every rank
    # reads one small entry, whatever the size of the world.
    merged = rendezvous.agree(
        world.base_store(),
        holder.key("agree"),
        world.global_rank(),
        world.world_size(),
        json.dumps(mine),
        merge=rendezvous.merge_name_sets,
        timeout=world.world_timeout(),
        step="reload: agreement",
    )
    return Agreement([rendezvous.expand_name_sets(merged)])


def _creation_call(
    record: Record, bound: timedelta
) -> tuple[tuple[Any, ...], dict[str, Any], list[int]]:
    """The record's ``new_group`` arguments with a timeout of at most ``bound``, and its ranks.

    The group's own timeout (the one it last had, ``set_timeout`` included) is given back once
    it exists; its rendezvous must not outwait WORLD's.
    """
    arguments = _new_group_signature().bind(*record.args, **record.kwargs)
    own = record.timeout
    arguments.arguments["timeout"] = bound if own is None else min(own, bound)
    ranks = arguments.arguments.get("ranks")
    members = list(range(world.world_size())) if ranks is None else sorted(ranks)
    return arguments.args, arguments.kwargs, members


def _create_again(record: Record) -> Any:
    """Create the record's group again, under its name; a missing peer fails within WORLD's
    timeout with an error naming the group, the cycle and the ranks that did not come."""
    holder = state.current()
    bound = world.world_timeout()
    args, kwargs, members = _creation_call(record, bound)
    store, key = world.base_store(), holder.key("create", record.name)
    if record.keep is not None:  # published while destroyed: torch registers the new one
        names.withdraw(record.name)
    started = time.monotonic()
    try:
        with names.forcing(record.name):
            native = original("new_group")(*args, **kwargs)
    except Exception as error:
        step = f"reload_process_groups(): creating group {record.name!r} (ranks {members})"
        cycle = f"world {holder.epoch}, cycle {holder.generation}"
        raise faults.failure(
            step,
            cycle,
            store=store,
            key=key,
            ranks=members,
            rank=world.global_rank(),
            timeout=bound,
            started=started,
            error=error,
        ) from error
    if record.timeout is not None and record.timeout > bound and type(native) is _Native:
        for _device, backend in device_backends(native):
            restore = getattr(backend, "_set_default_timeout", None)  # gloo's and nccl's have it
            if restore is not None:
                restore(record.timeout)
    return native


def _released_in_place(record: Record) -> RuntimeError:
    return RuntimeError(
        f"group {record.name!r} was released on this rank but a peer still holds it: a group "
        "reloaded in place (native mode) can only be rebuilt with every member, so release it "
        "on every member, or use the wrapper mode"
    )


def _rebuild_in_place(record: Record, agreed: Agreement) -> None:
    if record.name in agreed.released_in_place:
        raise RuntimeError(
            f"group {record.name!r} cannot be rebuilt in place: a member released it with "
            "torch.distributed.destroy_process_group(); release it on every member"
        )
    inplace.rebuild(record.native, record.name, record.timeout)
    record.move(State.LIVE)


def _replay_hooks(record: Record, native: Any) -> None:
    for entry in record.hooks:
        method, args, kwargs = entry
        if method == pools.ENTRY:
            pools.replay(native, entry, f"group {record.name!r}")
        else:
            getattr(native, method)(*args, **kwargs)


def reload_process_groups() -> None:
    """Recreate every destroyed group in creation order (WORLD first, when it was swapped).

    Reload hooks (``add_reload_hook``) run last, with the groups rebuilt; the memory guard
    checks before each rebuilt group's first collective; the cycle report records the step.
    """
    if not dist.is_initialized():
        raise RuntimeError(
            "reload_process_groups() needs torch.distributed to be initialized: call "
            "torch.distributed.init_process_group() first (WORLD was never initialized, or "
            "the program destroyed it)"
        )
    started = time.perf_counter()
    holder = state.current()
    if _nothing_to_do(holder, "reload_process_groups"):
        return
    part = report.StepReport()
    with _stepping(holder, "reload_process_groups"):
        _check_world(holder)
        if not holder.asleep:
            return
        holder.generation += 1
        pools.begin_reload()
        cycle = report.current((holder.generation + 1) // 2, holder.epoch)
        cycle.reload = part
        with part.phase("agreement"):
            agreed = _agree(holder)
        with part.phase("swap"):
            swapped = world.swap_in(_destroy_world)
            world.rebuild_in_place()
        rebuilt: list[Any] = []
        registered = world.registration()
        if swapped and registered is not None and registered.stand_in is not None:
            rebuilt.append(registered.stand_in)
            memory.arm(registered.stand_in)
        elif registered is not None and registered.in_place:
            rebuilt.append(c10d._get_default_group())
        taken_part: list[Any] = []
        names_of = {"rebuilt": [], "forgotten": [], "taken_part": []}
        with part.phase("creations"), names.keys_under(holder.key("groups") + "/"):
            for record in list(holder.records):
                if swapped and record.state is State.LIVE:
                    # Restoring WORLD tore down every group, also those made while it slept.
                    _unserve(record, destroy=False)
                    record.move(State.DESTROYED)
                begun = time.perf_counter()
                if record.name not in agreed.needed and record.state in (
                    State.RELEASED,
                    State.NON_MEMBER,
                ):
                    record.move(State.ENDED)
                    names_of["forgotten"].append(str(record.name))
                    continue
                elif record.in_place and record.state is State.DESTROYED:
                    if record.device is not None:
                        memory.check(record.device, f"group {record.name!r}")
                    _rebuild_in_place(record, agreed)
                    rebuilt.append(record.native)
                    names_of["rebuilt"].append(str(record.name))
                elif record.in_place and record.state is State.RELEASED:
                    raise _released_in_place(record)
                elif record.state is State.NON_MEMBER and record.name in agreed.in_place:
                    continue  # reconfigured by its members alone
                elif record.state is State.DESTROYED:
                    native = _create_again(record)
                    _serve(record, native)
                    record.move(State.LIVE)
                    _replay_hooks(record, native)
                    memory.arm(record.wrapper)  # the guard checks before its first call
                    if record.held is not None:
                        rebuilt.append(record.held)
                    names_of["rebuilt"].append(str(record.name))
                elif record.state in (State.RELEASED, State.NON_MEMBER):
                    # A peer still holds it: take part in its creation, keep nothing.
                    taken_part.append(_create_again(record))
                    names_of["taken_part"].append(str(record.name))
                else:
                    continue
                part.creations[str(record.name)] = (time.perf_counter() - begun) * 1e3
        if agreed.takes_part:
            # gloo closes a group's sockets when it is destroyed: a peer still finishing its
            # side of the handshake would see "Connection closed by peer". Every rank has
            # finished every creation once all of them pass this point.
            with part.phase("sync"):
                world.sync("created")
        for native in taken_part:
            if type(native) is _Native:
                destroy_native(native)
        registry.prune()
        holder.asleep = False
        with part.phase("hooks"):
            failures = hooks.run("after_reload", rebuilt)
    part.total_ms = (time.perf_counter() - started) * 1e3
    part.groups.update(names_of)
    cycle.measure("after_reload")
    report.log(cycle, "reload")
    if failures:
        raise hooks.error_for("after_reload", failures)


def release(group: Any) -> bool:
    """Destroy one of our groups for good (through the wrapper or its native handle).

    Returns False when ``group`` is not one of ours, so the caller hands it to torch.
    """
    if isinstance(group, ReloadableProcessGroup):
        record = group._record
        if record.is_world:
            return False  # destroying WORLD's stand-in destroys WORLD
    else:
        native = unwrap(group)
        if native is None or native is world.native_world():
            return False
        record = registry.record_of(native)
        if record is None:
            return False
    with registry.lock():
        if record.state in (State.LIVE, State.DESTROYED):
            # In place, the object is torch's registered group even while destroyed.
            _unserve(record, destroy=record.state is State.LIVE or record.in_place)
            record.move(State.RELEASED)
    return True


def end_world() -> None:
    """The program destroyed WORLD: torch tore down every group, and this world's records end."""
    if threaded_world():
        return  # nothing of ours belongs to a thread's world
    holder = state.current()
    with holder.lock:
        for record in holder.records:
            _unserve(record, destroy=False)  # torch destroyed every group, and its maps
            record.ended_with_world = True
            if record.state is not State.ENDED:
                record.move(State.ENDED)
        registry.prune()
        world.forget()
        holder.known_world = None
        holder.epoch += 1
        holder.generation = 0
        holder.asleep = False


def reloadable_groups() -> list[Any]:
    """The reloadable groups of this process that the program still holds.

    Wrappers, and in native mode torch's own groups.
    """
    out = []
    for record in registry.members():
        held = record.held
        if held is not None and record.state in (State.LIVE, State.DESTROYED):
            out.append(held)
    return out
