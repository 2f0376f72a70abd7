"""While a group sleeps by suspend: what slept, and the guard that refuses every use of it.

Nothing in torch or NCCL refuses a collective on a suspended communicator (its kernels read
unmapped memory). On torch 2.14 a ``ProcessGroup`` pre-hook, registered only while the group
sleeps, refuses every dispatcher path at no cost while awake; on torch 2.13 the group sits
behind a wrapper whose empty fast slot refuses (the way ``SUSPEND_WRAPPED``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ....errors import GroupSuspendedError
from .capability import OK, STATS, probe

#: The pre-hook id the guard registers under: "RPGS" in the high bytes, negative. torch 2.15
#: fires pre-hooks in ascending id order and attaches its flight recorder's hook to nccl2
#: groups at ids from 0x46524543 (its health check's from 0x4845414c); a guard at a larger id
#: fires after the recorder, which then keeps every refused collective as "issued, never
#: finished", a false lead in every hang dump. Below every id torch uses, the guard fires
#: first and nothing else sees a refused call. torch accepts negative ids (checked on
#: 2.14.1); an id already registered would be replaced silently, so it must be none of
#: torch's either.
HOOK_ID = -0x5250475300000000


@dataclass
class Sleep:
    """One group's sleep: its legs, the figures around it, and how it is guarded."""

    #: ``(device, backend)`` suspended (empty: guarded only, nothing was initialized).
    legs: list[tuple[Any, Any]] = field(default_factory=list)
    #: Device types whose tensors stay allowed while asleep (a CPU leg: gloo).
    awake: list[str] = field(default_factory=list)
    #: ``memory_stats()`` per leg (summed over legs) before the suspend and after the resume.
    before: dict[str, int] = field(default_factory=dict)
    asleep: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)
    suspend_ms: float = 0.0
    resume_ms: float = 0.0
    #: A pre-hook guards the native group (torch 2.14); else a wrapper does.
    hooked: bool = False

    def need(self) -> int:
        """Bytes a resume allocates again on this rank (``suspend`` of every leg)."""
        return int(self.before.get("suspend", 0))

    def report(self) -> dict[str, Any]:
        return {
            "legs": sorted({str(device) for device, _ in self.legs}),
            "stats_before": dict(self.before),
            "stats_asleep": dict(self.asleep),
            "stats_after": dict(self.after),
            "suspend_ms": round(self.suspend_ms, 3),
            "resume_ms": round(self.resume_ms, 3),
        }


def stats_of(legs: list[tuple[Any, Any]]) -> dict[str, int]:
    """The legs' ``memory_stats()`` summed (``suspended``: how many legs say 1)."""
    total = dict.fromkeys(STATS, 0)
    for _device, backend in legs:
        verdict, stats, _why = probe(backend)
        if verdict == OK and stats is not None:
            for key in STATS:
                total[key] += 1 if key == "suspended" and stats[key] > 0 else stats[key]
    return total


def guard_error(label: str, op: str) -> GroupSuspendedError:
    return GroupSuspendedError(
        f"{label} is suspended ({op}): reloadpg_autopatch.destroy_process_groups() released "
        "its communicator's memory; call reloadpg_autopatch.reload_process_groups() on every "
        "rank first (or create groups after the reload)"
    )


def _any_asleep(awake: list[str], tensors: Any) -> bool:
    for tensor in tensors or ():
        kind = getattr(getattr(tensor, "device", None), "type", None)
        if kind is not None and kind not in awake:
            return True
    return False


def hook_on(native: Any, awake: list[str], error: Callable[[str], BaseException]) -> None:
    """Refuse every use of ``native`` while it sleeps: a pre-hook, on torch 2.14.

    A call whose tensors are all on a device type that stays awake (the CPU leg of a
    ``cpu:gloo,cuda:nccl`` group) goes through; a barrier goes through where the group has a
    CPU leg (torch sends it there); a split is refused where torch runs the hook for it
    (torch 2.14's ``split_group`` does not: see docs/suspend.md, bypasses).
    """

    def refuse_while_asleep(args: Any) -> None:
        op = getattr(getattr(args, "name", None), "name", None) or str(getattr(args, "name", "?"))
        if awake and op != "SPLIT":
            tensors = [*(args.input_tensors or ()), *(args.output_tensors or ())]
            if tensors and not _any_asleep(awake, tensors):
                return
            if not tensors and op == "BARRIER":
                return
        raise error(op)

    native.register_pre_hook(HOOK_ID, refuse_while_asleep)


def hook_off(native: Any) -> None:
    native.unregister_pre_hook(HOOK_ID)
