"""``destroy_process_groups()``: free every reloadable group's communicator; the objects stay.

The first destroy of a cycle runs the before-destroy hooks, then meets every rank through the
store in one round (a group created just before the destroy may still be in some peer's
handshake, and gloo closes a group's sockets under it). That round also carries each rank's
answer for every group that sleeps by suspend, so every rank takes the same action for every
group and none enters NCCL's untimed barrier alone. Then every group about to sleep is guarded,
the suspends run in creation order (WORLD first), the other records are freed as
``decisions.destroy_step`` says, in reverse creation order, and WORLD is swapped when it is
registered on an accelerator that does not suspend. A destroy while asleep frees only the
groups made since.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ..errors import GroupBrokenError, ModeRefusedError
from . import (
    binding,
    hooks,
    inplace,
    memory,
    mode,
    names,
    participants,
    process,
    rendezvous,
    report,
    suspended,
    world,
)
from .decisions import DestroyFacts, DestroyStep, Reports, Sleep, destroy_step, sleep_verdict
from .process import Phase
from .record import Record, State, Way
from .stepping import nothing_to_do, one_step

logger = logging.getLogger("reloadpg_autopatch")


def facts(record: Record, verdicts: dict[str, Sleep] | None = None) -> DestroyFacts:
    """What the destroy's decision looks at for ``record``."""
    verdict = (verdicts or {}).get(str(record.name)) if record.way.suspends else None
    return DestroyFacts(record.state, record.way, binding.abandoned(record), verdict)


# ---- the groups that sleep by suspend ---------------------------------------------------


def sleepers(holder: process.ProcessState) -> list[Record]:
    """WORLD's record (when WORLD suspends), then the members that sleep by suspend."""
    out = []
    registered = holder.world
    if registered is not None and registered.record is not None:
        out.append(registered.record)
    out.extend(r for r in holder.records if r.way.suspends and r.member)
    return out


def _answers(holder: process.ProcessState) -> dict[str, Any]:
    """This rank's answer for every live group that sleeps by suspend: local calls only."""
    mine: dict[str, list[str]] = {
        "ok": [],
        "uninitialized": [],
        "unsupported": [],
        "released": [],
        "why": [],
        "awake": _still_known(holder),
    }
    for record in sleepers(holder):
        name = str(record.name)
        if binding.abandoned(record) or record.state is State.RELEASED:
            # Let go here (dropped, or destroy_process_group(g) while awake): no peer may
            # enter its barrier, which this rank will never join.
            mine["released"].append(name)
            continue
        if record.state is not State.LIVE:
            continue
        found = suspended.capability(record.native)
        if found.refusals or not found.legs:
            mine["unsupported"].append(name)
            mine["why"].extend(f"group {name!r}: {why}" for why in found.refusals)
        for answer in set(found.answers):
            mine["ok" if answer == suspended.OK else "uninitialized"].append(name)
    return mine


def _still_known(holder: process.ProcessState) -> list[str]:
    """The groups this rank left awake that torch still knows (the others are forgotten)."""
    if not holder.left_awake:
        return []
    known = {str(name) for name in c10d._world.pg_names.values()}
    with holder.lock:
        holder.left_awake &= known
        return sorted(holder.left_awake)


def _verdicts(merged: dict[str, Any]) -> dict[str, Sleep]:
    named = {key: set(merged.get(key, ())) for key in ("ok", "uninitialized", "unsupported")}
    named["released"] = set(merged.get("released", ()))
    every = set().union(*named.values())
    # A group some member left awake (its backends there serve the CPU or do not support
    # suspend) stays awake on every member: nobody suspends it, and nobody destroys it either
    # (that member would never take part in creating it again). Strict mode refuses it
    # (``_refuse_if_strict``). A group every member left awake is not the agreement's business.
    named["released"] |= set(merged.get("awake", ())) & every
    return {
        name: sleep_verdict(
            Reports(
                name in named["ok"],
                name in named["uninitialized"],
                name in named["unsupported"],
                name in named["released"],
            )
        )
        for name in every
    }


def _refuse_if_strict(verdicts: dict[str, Sleep], merged: dict[str, Any]) -> None:
    """In ``suspend`` mode a group some member cannot suspend (or left awake) is refused,
    alike on every rank."""
    if mode.get_reload_mode() != "suspend":
        return
    awake = set(merged.get("awake", ()))
    refused = sorted(n for n, v in verdicts.items() if v is Sleep.FALLBACK or n in awake)
    if not refused:
        return
    named = tuple(f"group {name!r}:" for name in refused)
    reasons = {why for why in merged.get("why", ()) if why.startswith(named)} | {
        f"group {name!r}: its members answered differently (it can suspend on some; on others "
        "its backends serve only the CPU or do not support suspend, so it was left awake)"
        for name in refused
        if name in awake
    }
    why = "; ".join(sorted(reasons)) or (
        "its members' communicators answered differently (initialized on some, not yet on others)"
    )
    raise ModeRefusedError(
        f"destroy_process_groups() ({participants.where('destroy')}): SLIME_RELOADABLE_PG_MODE"
        f"=suspend, but groups {', '.join(map(repr, refused))} cannot be suspended on every "
        f"member: {why}. Nothing was suspended or destroyed on any rank; use mode 'auto' to "
        "reload such groups another way"
    )


def label(record: Record) -> str:
    """How messages name the group: its description or name, and its ranks."""
    if record.is_world:
        return "WORLD"
    wrapper = record.wrapper
    if wrapper is not None:
        return wrapper.describe()
    desc = record.kwargs.get("group_desc")
    try:
        ranks = dist.get_process_group_ranks(record.native)
    except Exception:  # torch no longer knows it: the name says enough
        ranks = None
    shown = f"group {desc!r}" if desc else f"group {record.name!r}"
    return shown + (f" (ranks {ranks})" if ranks is not None else "")


def _guard(record: Record, suspend: bool) -> None:
    """Refuse every use of the group from now on, then it may sleep: a pre-hook on torch's
    own group (torch 2.14), or the wrapper's empty fast slot (torch 2.13)."""
    found = suspended.capability(record.native)
    sleep = suspended.Sleep(legs=found.legs if suspend else [], awake=found.awake)
    sleep.before = suspended.stats_of(sleep.legs)
    named = label(record)
    if record.way is Way.SUSPEND:

        def error(op: str) -> BaseException:
            if record.state is State.BROKEN:
                return GroupBrokenError(
                    f"{named} broke during a suspend or a resume ({op}) and cannot be used; "
                    "its communicator is in an unknown state: this process must restart"
                )
            return suspended.guard_error(named, op)

        suspended.hook_on(record.native, sleep.awake, error)
        sleep.hooked = True
    else:
        holder = record.wrapper
        if holder is None and record.is_world:
            holder = process.current().world.stand_in
        holder.sleep()
    record.sleep = sleep
    record.move(State.SUSPENDED)


def _suspend(record: Record, seconds: float) -> None:
    sleep = record.sleep
    for device, backend in sleep.legs:
        what = f"suspend() of {label(record)} on {device} ({participants.where('destroy')})"
        sleep.suspend_ms += suspended.call(backend, "suspend", what, seconds)
    sleep.asleep = suspended.stats_of(sleep.legs)


def _sleep(
    holder: process.ProcessState, verdicts: dict[str, Sleep], part: report.StepReport
) -> list[tuple[str, BaseException]]:
    """Guard every group about to sleep, then suspend them in creation order (WORLD first).

    A suspend that raises leaves its group broken (still guarded) and the others go on, so
    that no peer waits in NCCL's barrier for a group this rank skipped; the errors are raised
    once the step is done.
    """
    going = []
    for record in sleepers(holder):
        step = destroy_step(facts(record, verdicts))
        if record.is_world and step is DestroyStep.FREE_WRAPPED:
            step = DestroyStep.KEEP_RESIDENT  # WORLD is never destroyed here: it stays awake
        if step in (DestroyStep.SUSPEND, DestroyStep.GUARD):
            _guard(record, step is DestroyStep.SUSPEND)
            going.append(record)
            part.groups.setdefault(
                "suspended" if step is DestroyStep.SUSPEND else "guarded", []
            ).append(str(record.name))
        elif step is DestroyStep.KEEP_RESIDENT and record.state is State.LIVE:
            reason = verdicts.get(str(record.name), Sleep.FALLBACK).value
            part.groups.setdefault("resident", []).append(f"{record.name} ({reason})")
    failures = []
    seconds = suspended.suspend_timeout(participants.world_timeout())
    with part.phase("suspend"):
        for record in going:
            try:
                _suspend(record, seconds)
            except Exception as error:
                record.move(State.BROKEN)
                failures.append((str(record.name), error))
    return failures


def broken(failures: list[tuple[str, BaseException]], action: str, step: str) -> GroupBrokenError:
    """One error for the groups whose ``action`` (suspend, resume) raised during ``step``."""
    text = "; ".join(f"group {name!r}: {type(e).__name__}: {e}" for name, e in failures)
    call = "destroy_process_groups()" if step == "destroy" else "reload_process_groups()"
    error = GroupBrokenError(
        f"{call} ({participants.where(step)}) could not {action} {text}. Such a communicator "
        "is in an unknown state (NCCL may have released part of it): it stays refused, and "
        "this process must restart to use it again; every other group went on as usual"
    )
    error.__cause__ = failures[0][1]
    return error


def _release_abandoned(record: Record) -> None:
    binding.drop_if_abandoned(record)


def _free_wrapped(record: Record) -> None:
    record.timeout = participants.group_timeout(record.native)
    binding.unserve(record, destroy=True)
    record.move(State.DESTROYED)


def _free_in_place(record: Record) -> None:
    record.timeout = participants.group_timeout(record.native)
    record.device = memory.device_of(record.native)
    inplace.release(record.native)
    record.move(State.DESTROYED)


#: How each step is carried out; the steps that free a communicator are listed in ``FREES``.
EXECUTE: dict[DestroyStep, Callable[[Record], None]] = {
    DestroyStep.NOTHING: lambda record: None,
    DestroyStep.RELEASE_ABANDONED: _release_abandoned,
    DestroyStep.FREE_WRAPPED: _free_wrapped,
    DestroyStep.FREE_IN_PLACE: _free_in_place,
    # Carried out before the others, for every group at once (``_sleep``): guards, then
    # suspends. A group that stays resident is left as it is.
    DestroyStep.SUSPEND: lambda record: None,
    DestroyStep.GUARD: lambda record: None,
    DestroyStep.KEEP_RESIDENT: lambda record: None,
}
FREES = frozenset({DestroyStep.FREE_WRAPPED, DestroyStep.FREE_IN_PLACE})


def concerned(holder: process.ProcessState) -> list[Any]:
    """The groups a destroy frees on this rank, WORLD first, then in creation order."""
    out = []
    registered = holder.world
    if registered is not None and (registered.swap or registered.in_place or registered.suspend):
        out.append(c10d._world.default_pg)
    for record in holder.records:
        held = record.held
        if record.state is State.LIVE and record.member and held is not None:
            out.append(held)
    return out


def destroy_process_groups() -> None:
    """Free the communicators of every reloadable group; the group objects stay valid.

    With WORLD registered (``register_default_process_group``) and on an accelerator backend,
    WORLD is replaced by a temporary CPU WORLD after the ranks have synchronised, or suspended
    in place in suspend mode. Reload hooks (``add_reload_hook``) run first; the cycle report
    (``last_cycle_report``) records the step. Before ``init_process_group`` there is no world
    and nothing to destroy: it does nothing.
    """
    started = time.perf_counter()
    holder = process.current()
    if nothing_to_do(holder, "destroy_process_groups"):
        return
    if not dist.is_initialized():
        logger.debug("destroy_process_groups() before init_process_group(): nothing to destroy")
        return
    failures: list[tuple[str, BaseException]] = []
    failed: list[tuple[str, BaseException]] = []
    part = report.StepReport()
    cycle = None
    destroyed: list[str] = []
    with one_step(holder, "destroy_process_groups"):
        world.check_world(holder)
        holder.lost = None
        first = holder.phase is Phase.AWAKE
        holder.move(Phase.DESTROYING)
        try:
            if first:
                holder.cycle += 1
                holder.attempt = 0
                cycle = report.begin(holder)
                cycle.destroy = part
                cycle.measure("before_destroy")
                with part.phase("hooks"):
                    failures = hooks.run("before_destroy", concerned(holder))
                with part.phase("sync"):
                    merged = rendezvous.expand_name_sets(
                        participants.agree(
                            "destroy",
                            "agreement",
                            json.dumps(_answers(holder)).encode(),
                            rendezvous.merge_name_sets,
                        )
                    )
                verdicts = _verdicts(merged)
                _refuse_if_strict(verdicts, merged)
                failed = _sleep(holder, verdicts, part)
            else:
                verdicts = {}
            swapping = world.needs_swap()
            with part.phase("destroy"):
                for record in reversed(list(holder.records)):
                    asleep = record.state is not State.LIVE and record.way.suspends
                    if asleep and not binding.abandoned(record):
                        continue  # asleep by now, or broken: nothing more to free
                    step = destroy_step(facts(record, verdicts))
                    if step in (DestroyStep.SUSPEND, DestroyStep.GUARD):
                        # Made while asleep, or not at this destroy's agreement: freed by the
                        # next cycle, which asks every rank first.
                        continue
                    EXECUTE[step](record)
                    if step in FREES:
                        destroyed.append(str(record.name))
            if swapping:
                with part.phase("swap"):
                    world.swap_out()
            elif first:
                world.release_in_place()
            for record in holder.records:
                if record.state is State.DESTROYED and record.published is not None:
                    # torch unregistered the name with the native group: whatever resolves it
                    # while destroyed (functional collectives, DTensor, a compiled graph) must
                    # get the group that says to reload, not "could not resolve".
                    names.publish(record.name, record.published)
        except BaseException:
            if holder.phase is Phase.DESTROYING:  # a lost WORLD has reset the phase already
                holder.move(Phase.ASLEEP if destroyed or not first else Phase.AWAKE)
            raise
        holder.move(Phase.ASLEEP)
    part.total_ms = (time.perf_counter() - started) * 1e3
    part.groups["destroyed"] = destroyed[::-1]
    if cycle is None:
        logger.info("destroyed %d more process groups in %.1f ms", len(destroyed), part.total_ms)
        return
    cycle.sleep = {str(r.name): r.sleep.report() for r in sleepers(holder) if r.sleep is not None}
    cycle.measure("after_destroy")
    report.log(cycle, "destroy")
    if failed:
        raise broken(failed, "suspend", "destroy")
    if failures:
        raise hooks.error_for("before_destroy", failures)
