"""``reload_process_groups()``: rebuild, in creation order, every group some rank still holds.

Before touching anything, the ranks publish through the store which groups they still hold and
whether they have the memory to resume what sleeps by suspend (``agree``), so a group every rank
let go of is dropped on every rank at once, the creations stay aligned, and a rank short of
memory makes every rank refuse alike before any resume. Then the suspended groups resume in
creation order (WORLD first) and their guards come off, WORLD comes back (when it was swapped),
and each record takes the step ``decisions.reload_step`` gives it, executed through
``EXECUTE``. Each group is created again under the name it always had, with keys of this cycle
(``names``), and gets back its timeout and what was registered on it (``Record.replays``).
"""

from __future__ import annotations

import gc
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from .._originals import destroy_native, original
from ..errors import MemoryShortError, ModeRefusedError, ReloadPGError, WorldLostError
from . import (
    binding,
    destroy,
    faults,
    guard,
    hooks,
    inplace,
    memory,
    names,
    participants,
    pools,
    process,
    registry,
    rendezvous,
    report,
    suspended,
    world,
)
from .backends import device_backends
from .creation import new_group_signature
from .decisions import ReloadFacts, ReloadStep, reload_step
from .process import Phase
from .record import Record, State
from .stepping import nothing_to_do, one_step

logger = logging.getLogger("reloadpg_autopatch")

_Native = dist.ProcessGroup


class Agreement:
    """What every rank learns, before a reload creates anything, about every group."""

    def __init__(self, merged: dict[str, Any]) -> None:
        #: Groups some rank still holds: they are rebuilt, the others are forgotten.
        self.needed = set(merged["held"])
        #: Ranks short of memory to resume what sleeps by suspend: one line each.
        self.short = sorted(merged.get("short", ()))
        #: Groups reloaded in place: their non-members have nothing to create.
        self.in_place = set(merged["in_place"])
        #: Groups reloaded in place that a member released: they cannot be rebuilt.
        self.released_in_place = set(merged["released_in_place"])
        #: Whether some rank takes part in creating a group it released (and frees it after).
        self.takes_part = bool(merged["takes_part"])


def _preflight(holder: process.ProcessState) -> list[str]:
    """Whether this rank has the memory to resume its suspended groups: nothing, or one line.

    The exact need is what ``memory_stats()`` called suspendable before the suspend, plus the
    memory guard's margin (``SLIME_RELOADABLE_PG_MIN_FREE_GB``); when short, garbage is
    collected and the cache emptied, then the figures are read again. Where there is no query
    for the device, there is nothing to compare and the rank counts as ready.
    """
    needs: dict[str, list[Any]] = {}
    for record in destroy.sleepers(holder):
        sleep = record.sleep
        if record.state is not State.SUSPENDED or sleep is None:
            continue
        for device, _backend in sleep.legs:
            entry = needs.setdefault(device.type, [0, []])
            entry[0] += sleep.need() // max(len(sleep.legs), 1)
            entry[1].append(str(record.name))
    margin = int(guard.get_memory_guard().min_free_gb * memory.GiB)
    lines = []
    for kind, (need, groups) in needs.items():
        device = memory.current_device(kind)
        now = memory.figures(device)
        if now is None or now.free >= need + margin:
            continue
        gc.collect()
        try:
            memory.clear(device)
        except Exception as error:
            logger.warning("emptying the cache of %s failed: %s", device, error)
        now = memory.figures(device) or now
        if now.free < need + margin:
            lines.append(
                f"rank {participants.global_rank()} has {memory.human(now.free)} free on "
                f"{device} and needs {memory.human(need + margin)} ({memory.human(need)} to "
                f"resume groups {', '.join(map(repr, groups))} plus the {memory.human(margin)} "
                "margin of SLIME_RELOADABLE_PG_MIN_FREE_GB)"
            )
    return lines


def _agree(holder: process.ProcessState) -> Agreement:
    """Every rank publishes one entry in the store and reads one merged entry: one round trip.

    The last rank to arrive merges the N entries (``rendezvous.agree``), so each rank makes
    O(1) store operations, not N reads. Every rank gets the same answers, so every rank makes
    the same creations in the same order, and skips the same ones.
    """
    held, in_place, released_in_place, takes_part = [], [], [], False
    for record in list(holder.records):
        binding.drop_if_abandoned(record)
        kept = (State.LIVE, State.DESTROYED, State.SUSPENDED, State.BROKEN)
        if record.member and record.state in kept:
            held.append(record.name)
            # Reconfigured, resumed or kept awake: its members create nothing for it.
            if record.in_place or (record.way.suspends and record.state is not State.DESTROYED):
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
        "short": _preflight(holder),
    }
    # The last rank to arrive merges the entries (unions, names packed as runs): every rank
    # reads one small entry, whatever the size of the world.
    merged = participants.agree(
        "reload", "agreement", json.dumps(mine).encode(), rendezvous.merge_name_sets
    )
    return Agreement(rendezvous.expand_name_sets(merged))


def facts(record: Record, agreed: Agreement, world_restored: bool) -> ReloadFacts:
    """What the reload's decision looks at for ``record``."""
    return ReloadFacts(
        state=record.state,
        way=record.way,
        release_pending=record.release_pending,
        needed=record.name in agreed.needed,
        peers_in_place=record.name in agreed.in_place,
        released_by_a_member=record.name in agreed.released_in_place,
        world_restored=world_restored,
    )


def _creation_call(
    record: Record, bound: timedelta
) -> tuple[tuple[Any, ...], dict[str, Any], list[int]]:
    """The record's ``new_group`` arguments with a timeout of at most ``bound``, and its ranks.

    The group's own timeout (the one it last had, ``set_timeout`` included) is given back once
    it exists; its rendezvous must not outwait WORLD's.
    """
    arguments = new_group_signature().bind(*record.args, **record.kwargs)
    own = record.timeout
    arguments.arguments["timeout"] = bound if own is None else min(own, bound)
    ranks = arguments.arguments.get("ranks")
    members = list(range(participants.world_size())) if ranks is None else sorted(ranks)
    return arguments.args, arguments.kwargs, members


def _create_again(record: Record) -> Any:
    """Create the record's group again, under its name; a missing peer fails within WORLD's
    timeout with an error naming the group, the cycle and the ranks that did not come."""
    holder = process.current()
    bound = participants.world_timeout()
    args, kwargs, members = _creation_call(record, bound)
    store = participants.base_store()
    key = holder.key("reload", "create", holder.token, record.name)
    if record.published is not None:  # published while destroyed: torch registers the new one
        names.withdraw(record.name)
    started = time.monotonic()
    try:
        with names.forcing(record.name):
            native = original("new_group")(*args, **kwargs)
    except Exception as error:
        raise faults.failure(
            f"reload_process_groups(): creating group {record.name!r} (ranks {members})",
            participants.where("reload"),
            store=store,
            key=key,
            ranks=members,
            rank=participants.global_rank(),
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


def _replay(record: Record, native: Any) -> None:
    for entry in record.replays:
        method, args, kwargs = entry
        if method == pools.ENTRY:
            pools.replay(native, entry, f"group {record.name!r}")
        else:
            getattr(native, method)(*args, **kwargs)


@dataclass
class _Run:
    """What one reload has done so far (for the hooks and the report)."""

    #: The groups rebuilt, in order, for the after-reload hooks.
    rebuilt: list[Any] = field(default_factory=list)
    #: Native groups created only to take part, freed once every rank has created them.
    taken_part: list[Any] = field(default_factory=list)
    #: Group names per outcome, for the report.
    names: dict[str, list[str]] = field(
        default_factory=lambda: {"rebuilt": [], "forgotten": [], "taken_part": [], "resumed": []}
    )
    #: Suspended groups whose resume raised.
    failures: list[tuple[str, BaseException]] = field(default_factory=list)


def _forget(record: Record, run: _Run) -> None:
    record.move(State.ENDED)
    run.names["forgotten"].append(str(record.name))


def _recreate(record: Record, run: _Run) -> None:
    native = _create_again(record)
    binding.serve(record, native)
    record.move(State.LIVE)
    _replay(record, native)
    guard.arm(record.wrapper)  # the guard checks before its first call
    if record.held is not None:
        run.rebuilt.append(record.held)
    run.names["rebuilt"].append(str(record.name))


def _recreate_after_restore(record: Record, run: _Run) -> None:
    # Restoring WORLD tore down every group, also those made while it slept.
    binding.unserve(record, destroy=False)
    record.move(State.DESTROYED)
    _recreate(record, run)


def _rebuild_in_place(record: Record, run: _Run) -> None:
    if record.device is not None:
        guard.check(record.device, f"group {record.name!r}")
    inplace.rebuild(record.native, record.name, record.timeout)
    record.move(State.LIVE)
    run.rebuilt.append(record.native)
    run.names["rebuilt"].append(str(record.name))


def _take_part(record: Record, run: _Run) -> None:
    # A peer still holds it: take part in its creation, keep nothing.
    run.taken_part.append(_create_again(record))
    run.names["taken_part"].append(str(record.name))


def _resume(record: Record, run: _Run, seconds: float) -> None:
    sleep = record.sleep
    for device, backend in sleep.legs:
        what = f"resume() of {destroy.label(record)} on {device} ({participants.where('reload')})"
        sleep.resume_ms += suspended.call(backend, "resume", what, seconds)
    sleep.after = suspended.stats_of(sleep.legs)


def _wake(record: Record, run: _Run) -> None:
    """The guard comes off: the group is usable again (and released, if the program asked)."""
    sleep = record.sleep
    if sleep.hooked:
        suspended.hook_off(record.native)
    else:
        holder = record.wrapper
        if holder is None and record.is_world:
            holder = process.current().world.stand_in
        if holder is not None:
            holder.wake()
    record.move(State.LIVE)
    run.names["resumed"].append(str(record.name))
    if record.release_pending:  # every member resumed it (collective); now it goes, here
        binding.unserve(record, destroy=True)
        record.move(State.RELEASED)
        return
    held = c10d._get_default_group() if record.is_world else record.held
    if held is not None:
        run.rebuilt.append(held)


def _wake_all(holder: process.ProcessState, part: report.StepReport, run: _Run) -> list[Any]:
    """Resume every suspended group in creation order (WORLD first), then lift the guards.

    A resume that raises leaves its group broken, still refused, and the others go on; the
    errors are raised once the step is done.
    """
    asleep = [r for r in destroy.sleepers(holder) if r.state is State.SUSPENDED]
    failures = []
    seconds = suspended.suspend_timeout(participants.world_timeout())
    with part.phase("resume"):
        for record in asleep:
            try:
                _resume(record, run, seconds)
            except Exception as error:
                record.move(State.BROKEN)
                failures.append((str(record.name), error))
    for record in asleep:
        if record.state is State.SUSPENDED:
            _wake(record, run)
    return failures


def _refuse_released_by_a_member(record: Record, run: _Run) -> None:
    raise ModeRefusedError(
        f"group {record.name!r} cannot be rebuilt in place: a member released it with "
        "torch.distributed.destroy_process_group(); release it on every member"
    )


def _refuse_released_here(record: Record, run: _Run) -> None:
    raise ModeRefusedError(
        f"group {record.name!r} was released on this rank but a peer still holds it: a group "
        "reloaded in place (native mode) can only be rebuilt with every member, so release it "
        "on every member, or use the wrapper mode"
    )


def _refuse_torn_down(record: Record, run: _Run) -> None:
    raise ModeRefusedError(
        f"group {record.name!r} reloads in place, but restoring the swapped WORLD tore its "
        "communicator down; register WORLD in native mode too, or use mode 'auto'"
    )


#: How each step is carried out. ``TIMED``: the steps whose time the report gives per group.
EXECUTE: dict[ReloadStep, Callable[[Record, _Run], None]] = {
    ReloadStep.NOTHING: lambda record, run: None,
    ReloadStep.FORGET: _forget,
    ReloadStep.RECREATE: _recreate,
    ReloadStep.RECREATE_AFTER_RESTORE: _recreate_after_restore,
    ReloadStep.REBUILD_IN_PLACE: _rebuild_in_place,
    ReloadStep.TAKE_PART: _take_part,
    ReloadStep.LEAVE_TO_MEMBERS: lambda record, run: None,
    ReloadStep.REFUSE_RELEASED_BY_A_MEMBER: _refuse_released_by_a_member,
    ReloadStep.REFUSE_RELEASED_HERE: _refuse_released_here,
    ReloadStep.REFUSE_TORN_DOWN: _refuse_torn_down,
    # Carried out first, for every group at once (``_wake_all``): resumes, then the guards.
    ReloadStep.RESUME: lambda record, run: None,
    ReloadStep.RESUME_THEN_RELEASE: lambda record, run: None,
}
TIMED = frozenset(
    {
        ReloadStep.RECREATE,
        ReloadStep.RECREATE_AFTER_RESTORE,
        ReloadStep.REBUILD_IN_PLACE,
        ReloadStep.TAKE_PART,
    }
)


def _not_initialized() -> ReloadPGError:
    lost = process.current().lost
    if lost is not None:
        return WorldLostError(f"reload_process_groups() cannot reload this world: {lost}")
    return ReloadPGError(
        "reload_process_groups() needs torch.distributed to be initialized: call "
        "torch.distributed.init_process_group() first (WORLD was never initialized, or "
        "the program destroyed it)"
    )


def reload_process_groups() -> None:
    """Recreate every destroyed group in creation order (WORLD first, when it was swapped).

    Reload hooks (``add_reload_hook``) run last, with the groups rebuilt; the memory guard
    checks before each rebuilt group's first collective; the cycle report records the step.
    """
    if not dist.is_initialized():
        raise _not_initialized()
    started = time.perf_counter()
    holder = process.current()
    if nothing_to_do(holder, "reload_process_groups"):
        return
    part = report.StepReport()
    run = _Run()
    with one_step(holder, "reload_process_groups"):
        world.check_world(holder)
        if holder.phase is not Phase.ASLEEP:
            return
        holder.lost = None
        holder.move(Phase.RELOADING)
        holder.attempt += 1
        try:
            cycle = _reload(holder, part, run)
        except BaseException:
            if holder.phase is Phase.RELOADING:  # a lost WORLD has reset the phase already
                holder.move(Phase.ASLEEP)
            raise
        holder.move(Phase.AWAKE)
        with part.phase("hooks"):
            failures = hooks.run("after_reload", run.rebuilt)
    part.total_ms = (time.perf_counter() - started) * 1e3
    part.groups.update({k: v for k, v in run.names.items() if v or k != "resumed"})
    cycle.sleep = {
        str(r.name): r.sleep.report() for r in destroy.sleepers(holder) if r.sleep is not None
    }
    cycle.measure("after_reload")
    report.log(cycle, "reload")
    if run.failures:
        raise destroy.broken(run.failures, "resume", "reload")
    if failures:
        raise hooks.error_for("after_reload", failures)


def _reload(holder: process.ProcessState, part: report.StepReport, run: _Run) -> Any:
    pools.begin_reload()
    cycle = report.current(holder)
    with part.phase("agreement"):
        agreed = _agree(holder)
    if agreed.short:
        shown = "; ".join(agreed.short[:8]) + (
            f"; and {len(agreed.short) - 8} more" if len(agreed.short) > 8 else ""
        )
        raise MemoryShortError(
            f"reload_process_groups() ({participants.where('reload')}): {shown}. Nothing was "
            "resumed on any rank and the groups still sleep: free accelerator memory (for "
            "instance offload the rollout engine first) and call reload_process_groups() again"
        )
    # Only now is this attempt the cycle's reload: a refused one leaves the report (its
    # destroy's figures) to the retry.
    cycle.reload = part
    run.failures = _wake_all(holder, part, run)
    with part.phase("swap"):
        restored = world.swap_in()
        world.rebuild_in_place()
    registered = holder.world
    if restored and registered is not None and registered.stand_in is not None:
        run.rebuilt.append(registered.stand_in)
        guard.arm(registered.stand_in)
    elif registered is not None and registered.in_place:
        run.rebuilt.append(c10d._get_default_group())
    groups_prefix = holder.key("reload", "groups", holder.token) + "/"
    with part.phase("creations"), names.keys_under(groups_prefix):
        for record in list(holder.records):
            begun = time.perf_counter()
            step = reload_step(facts(record, agreed, restored))
            EXECUTE[step](record, run)
            if step in TIMED:
                part.creations[str(record.name)] = (time.perf_counter() - begun) * 1e3
    if agreed.takes_part:
        # gloo closes a group's sockets when it is destroyed: a peer still finishing its
        # side of the handshake would see "Connection closed by peer". Every rank has
        # finished every creation once all of them pass this point.
        with part.phase("sync"):
            participants.sync("reload", "created")
    for native in run.taken_part:
        if type(native) is _Native:
            destroy_native(native)
    registry.prune()
    return cycle


def wake_before_world_ends() -> None:
    """The program ends WORLD while groups sleep suspended: resume them first.

    By the SPMD contract every rank ends WORLD at the same point, so every member resumes
    each group (collective) before torch tears it down; no memory preflight: the memory goes
    away with the world. A forked child in its parent's world has nothing to resume.
    """
    holder = process.current()
    if nothing_to_do(holder, "destroy_process_group"):
        return
    if not any(r.state is State.SUSPENDED for r in destroy.sleepers(holder)):
        return
    failures = _wake_all(holder, report.StepReport(), _Run())
    for name, error in failures:
        logger.error("resuming group %r before WORLD ends failed: %s", name, error)
