"""Who takes part in a step, through which store, with what timeout.

Every store step of a cycle involves every rank of WORLD, through the store WORLD was created
with (it outlives every communicator, WORLD's own included), and waits at most WORLD's timeout.
With WORLD registered (``register_default_process_group``) those come from the registration
(``world.registration``), which keeps them across WORLD's swap; otherwise from torch's default
group. This module alone writes the holder's ``rounds``: each round's fresh token and the key
of its result, which the next round deletes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from .. import faults, process
from . import entries, failures, rounds, stalled, sweep

logger = logging.getLogger("reloadpg_autopatch")


def registration() -> Any:
    """This process's registration (``world.registration.Registration``), if WORLD is
    registered."""
    return process.current().world.registration


def is_registered() -> bool:
    """Whether WORLD takes part in destroy/reload in this process."""
    return registration() is not None


def token() -> str:
    """The fresh token of this step's last store round, the same on every rank."""
    return process.current().rounds.token


def _source() -> Any:
    """WORLD's registration, which keeps these across WORLD's swap; else torch's answers."""
    return process.current().world.facts


def base_store() -> Any:
    """The store every rank shares for the life of this world (it outlives WORLD itself).

    Over a Python ``Store``, torch's ``PrefixStore`` cannot delete: then the rounds delete
    through the inner store (``sweep.Through``), under the prefix torch gave WORLD's store.
    """
    store = _source().store
    rounds = process.current().rounds
    if rounds.through is None or rounds.through[0] is not store:
        rounds.through = (store, _deleting(store))
    return rounds.through[1]


def _deleting(store: Any) -> Any:
    """``store``, or a view of it whose deletes reach the inner store (``base_store``)."""
    inner = getattr(store, "underlying_store", None)
    if inner is None or type(inner).__module__.startswith("torch"):
        return store  # not a prefix store, or one over a store of torch's: deletes work
    from torch.distributed import distributed_c10d as c10d  # a world exists: torch is in

    for group, (_backend, held) in list(c10d._world.pg_map.items()):
        if held is store:  # torch's PrefixStore(f"{group_name}/", store) of that group
            return sweep.Through(store, inner, f"{group.group_name}/")
    return store


def world_timeout() -> timedelta:
    """What every store wait of a step is bounded by."""
    return _source().timeout


def step_failed() -> None:
    """A step failed (or was interrupted) on this rank: its peers may still be inside it."""
    process.current().rounds.after_failure = True


def _round_timeout(holder: process.ProcessState) -> timedelta:
    """WORLD's timeout; twice that and the failure paths' graces for the first round after a
    step failed here (``step_failed``): a peer still waiting inside that step for this rank
    leaves it only after WORLD's timeout and its failure path, then comes (a retry after a
    ``KeyboardInterrupt`` in a reload meets the peers it left, instead of blaming them)."""
    bound = world_timeout()
    if not holder.rounds.after_failure:
        return bound
    holder.rounds.after_failure = False
    return 2 * bound + timedelta(seconds=faults.GRACE_S + stalled.GRACE_S)


def global_rank() -> int:
    return _source().rank


def world_size() -> int:
    return _source().world_size


def where(step: str) -> str:
    """How errors name ``step`` of the cycle running now."""
    return f"cycle {process.current().cycle}, {step}"


def sync(step: str, point: str, *, token: bool = False) -> None:
    """Wait until every rank reaches ``point`` of ``step`` in this cycle, through the store.

    Ranks may arrive up to WORLD's timeout apart; three store operations per rank
    (``rounds.sync``). A missing rank is named in the error, after WORLD's timeout.
    ``token``: every rank also reads the step's fresh token (``token()``).
    """
    holder = process.current()
    key = holder.key(step, "sync", point)
    fresh = rounds.sync(
        base_store(),
        key,
        global_rank(),
        world_size(),
        timeout=_round_timeout(holder),
        step=f"{step}: {point} sync",
        cycle=where(step),
        previous=_round_done(holder, key),
        token=token,
    )
    if fresh is not None:
        holder.rounds.token = fresh


def agree(step: str, point: str, payload: bytes, merge: Any) -> bytes:
    """Every rank's ``payload`` merged by the last to arrive; every rank reads the one result.

    It also gives every rank the step's fresh token (``token()``). After the destroy's round,
    the first of a cycle, this rank deletes what its creations wrote before it (``_tidy``).
    """
    holder = process.current()
    key = holder.key(step, point)
    first = step == "destroy"  # every rank has finished the cycle before once this round ends
    written, marked = _take(holder) if first else ([], [])
    try:
        holder.rounds.token, merged = rounds.agree(
            base_store(),
            key,
            global_rank(),
            world_size(),
            payload,
            merge=merge,
            timeout=_round_timeout(holder),
            step=f"{step}: {point}",
            cycle=where(step),
            previous=_round_done(holder, key),
            token=True,
        )
    except BaseException:
        holder.rounds.written[:0], holder.rounds.marked[:0] = written, marked  # a later round
        raise
    if first:
        _tidy(holder, written, marked)
    return merged


#: The rank that hosts the store: torch's rendezvous (torchrun, ``env://``, ``tcp://``) puts
#: the TCPStore's server in rank 0's process.
STORE_HOST = 0


@contextlib.contextmanager
def agreed_outcome() -> Iterator[None]:
    """Around what every rank decides from the last round's result: an error raised there is
    raised alike on every rank, so the store's host first waits until every rank has read that
    result (``failures.settle``; bounded by WORLD's timeout), and its exit right after
    cannot take the result away from a peer. Nothing is added while no error is raised."""
    try:
        yield
    except BaseException:
        last = process.current().rounds.last
        if last is not None:
            rank = global_rank()
            failures.settle(
                last[0],
                last[1],
                rank,
                world_size(),
                timeout=world_timeout(),
                host=rank == STORE_HOST,
            )
        raise


def wrote(store: Any, key: str) -> None:
    """torch wrote ``key`` through ``store`` in a creation of this rank's (``written``): this
    rank deletes it after the next cycle's first round, when no rank reads it any more."""
    process.current().rounds.written.append((store, key))


def mark(marker: str) -> None:
    """Keys holding ``marker`` that torch wrote in this step where the package cannot note
    them (a reconfigure of a backend whose keys are not known): this rank deletes them after
    the next cycle's first round, finding them in one listing of the store for all marks."""
    process.current().rounds.marked.append(marker)


def _take(holder: process.ProcessState) -> tuple[list[tuple[Any, str]], list[str]]:
    """What this rank wrote (and marked) before it arrives at a cycle's first round."""
    rounds = holder.rounds
    written, rounds.written = rounds.written, []
    marked, rounds.marked = rounds.marked, []
    return written, marked


def _tidy(holder: process.ProcessState, written: list[tuple[Any, str]], marked: list[str]) -> None:
    """Delete what this rank's creations wrote in the cycles before: every rank has finished
    them (``sweep``). Nothing is listed or deleted after a cycle that created nothing,
    but once per world, at its first destroy, WORLD's rank 0 sweeps the keys of ours that an
    earlier world on the same store left (one that crashed)."""
    for store, key in written:
        sweep.delete(store, key)
    if marked:
        sweep.sweep_marked(base_store(), marked)
    if holder.cycle == 1 and global_rank() == 0:
        sweep.sweep(base_store(), holder.cycle)


def _round_done(holder: process.ProcessState, key: str) -> str | None:
    """The previous world-wide round's result key (deleted by this round's last arriver).

    Every rank has read it once it arrives at the next round, and every rank runs the same
    rounds in the same order, so the last arriver of a round may delete its predecessor's:
    the store holds at most one result key of ours at a time, whatever the number of cycles.
    """
    last = holder.rounds.last
    holder.rounds.last = (base_store(), rounds.done_key(key), world_size())
    return last[1] if last is not None else None


def tidy() -> None:
    """The world ends: the last rank to end it deletes the last round's result.

    A peer may not have read that result yet (it arrived first and waits for it while this
    rank, the last to arrive, already returned), so no rank deletes it on its own: each counts
    itself out, one ``add``, and the one that makes the count WORLD's size deletes the result
    and the count, every rank having read it by then. A rank that never ends (it died) leaves
    both, and the next world's sweep (``sweep``) clears them.
    """
    rounds = process.current().rounds
    last, rounds.last = rounds.last, None
    rounds.written, rounds.marked = [], []  # the world's store may go with it: left there
    if last is None:
        return
    store, key, ranks = last
    try:
        ended = store.add(f"{key}/ended", 1)
    except Exception as error:  # the store's host may be gone already: nothing to tidy
        logger.debug("could not count out of %r: %s", key, error)
        return
    if ended == ranks:
        entries.tidy(store, key, f"{key}/ended")
