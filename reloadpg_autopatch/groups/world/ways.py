"""WORLD's ways: the ways any group has, as WORLD takes them, and WORLD's swap.

Registered, WORLD is the first record: destroy and reload ask its way as they ask any other.
WORLD differs from a group in what it is (torch's default group: reports name it WORLD, the
program never releases it, the hooks get the default group) and in one way of its own: the
swap, WORLD behind its stand-in, which is its wrapper way. A destroy replaces an accelerator
WORLD with a temporary CPU WORLD (torch cannot run without a default group) and a reload
restores it, which tears down every group torch knew (``ReloadRun.torn_down``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch.distributed import distributed_c10d as c10d

from ..._env import MODE_ENV
from ...errors import ModeRefusedError, ReloadPGError
from .. import frees, guard
from .. import ways as group_ways
from ..agreement import DestroyAnswers, ReloadAnswers
from ..backends import holds_accelerator_memory
from ..decisions import DestroyFacts, DestroyStep, ReloadFacts, ReloadStep
from ..record import Record, State
from ..runs import DestroyRun, ReloadRun
from ..store import channel
from ..ways import register
from ..ways.base import Way
from ..ways.inplace import InPlace, in_place_refusal, rebuild, release
from ..ways.suspend import Suspend, SuspendWrapped, capability, suspend_refusal
from ..ways.wrapper import Wrapper
from . import carry, facts, swap

#: ``world_refusal``'s answer for a WORLD that stays awake under that way, untouched.
AWAKE = "stays awake"


class _World:
    """What WORLD is, whichever way it takes: no group of the program's (not listed, not named
    in the report's per-group outcomes), freed after every group."""

    frees_last: ClassVar[bool] = True

    def world_refusal(
        self, group: Any, backend: str, named: bool, chosen: tuple[str, ...] | None
    ) -> str | None:
        """Why WORLD cannot take this way (None: it can; ``AWAKE``: it stays awake)."""
        raise NotImplementedError

    def world_strict_error(self, group: Any, backend: str, refusal: str) -> ModeRefusedError:
        """The error of a mode with this way alone, for a WORLD it cannot take."""
        return self.strict_error(str(group.group_name), refusal)

    def note(self, run: DestroyRun | ReloadRun, outcome: str, record: Record) -> None:
        pass

    def timed(self, run: ReloadRun, record: Record, milliseconds: float) -> None:
        pass

    def listed(self, record: Record) -> bool:
        return False

    def label(self, record: Record) -> str:
        return "WORLD"

    def describe(self, record: Record, ranks: list[int]) -> str:
        return f"WORLD (ranks {ranks})"

    def held(self, record: Record) -> Any:
        return c10d._world.default_pg

    def releasable(self, record: Record) -> bool:
        return False  # destroying WORLD ends the world (``end.end_world``)

    def can_free_instead(self, record: Record) -> bool:
        return False  # suspended even where a suspend gives back little: WORLD stays WORLD

    def answer_reload(self, record: Record, answers: ReloadAnswers) -> None:
        """WORLD is no group a reload creates, takes part in or forgets."""

    def release_abandoned(self, record: Record, run: DestroyRun) -> None:
        """Never dropped: the registration holds WORLD's stand-in for the life of the world."""


class WorldSwap(_World, Way):
    """WORLD behind its stand-in, swapped for a temporary CPU WORLD while asleep."""

    name: ClassVar[str] = "WORLD swapped for a temporary WORLD"

    def world_refusal(
        self, group: Any, backend: str, named: bool, chosen: tuple[str, ...] | None
    ) -> str | None:
        """Swapped where its backend holds accelerator memory (as torch registers it), or
        where ``accelerator_backends`` names it; else it stays awake."""
        swapped = named if chosen is not None else holds_accelerator_memory(backend)
        return None if swapped else AWAKE

    @staticmethod
    def answer_destroy_for_rank(answers: DestroyAnswers) -> None:
        """The groups left alone that this torch would reach through the swap anyway."""
        if facts.needs_swap():
            answers.untouchable.extend(carry.obstacles(carry.left_alone()))

    @staticmethod
    def after_destroy_agreement(run: DestroyRun) -> None:
        """Refused alike on every rank, before anything sleeps, where some rank's group left
        alone would not come through the swap as it was; else those groups are reported."""
        agreed = run.agreed
        if agreed is not None and agreed.untouchable:
            raise ReloadPGError(
                f"destroy_process_groups() ({channel.where('destroy')}): WORLD is swapped "
                "for a temporary WORLD on destroy, which torch does by destroying WORLD, and "
                "that would end groups this package did not make: "
                f"{'; '.join(sorted(agreed.untouchable))}. Nothing was destroyed on any rank. "
                "Destroy those groups first (torch.distributed.destroy_process_group(group)), "
                "or register WORLD in a mode that keeps it (suspend, native)"
            )
        if channel.registration() is not None:
            left = carry.left_alone()
            if left:
                run.part.left_alone = carry.report(left)

    def sleep_step(self, facts: DestroyFacts) -> DestroyStep:
        return DestroyStep.FREE_WRAPPED

    def made_while_asleep_step(self, facts: ReloadFacts) -> ReloadStep:
        return ReloadStep.NOTHING

    def phase(self, step: DestroyStep | ReloadStep) -> str:
        return "swap"

    def free(self, record: Record, run: DestroyRun) -> None:
        if frees.aborting_now():
            return  # a peer is gone: a swap would wait for it; WORLD stays as it is
        swap.swap_out()
        record.move(State.DESTROYED)

    def broke(self, record: Record) -> None:
        """WORLD is left as it was (awake, not swapped): nothing of it was aborted."""

    def recreate(self, record: Record, run: ReloadRun) -> None:
        swap.swap_in()
        record.move(State.LIVE)
        run.torn_down = True  # torch tore down every group it knew
        stand_in = channel.registration().stand_in
        run.rebuilt.append(stand_in)
        guard.arm(stand_in)


class WorldInPlace(_World, InPlace):
    """WORLD's communicator shut down and reconfigured inside torch's default group."""

    name: ClassVar[str] = "WORLD in place"

    def world_refusal(
        self, group: Any, backend: str, named: bool, chosen: tuple[str, ...] | None
    ) -> str | None:
        return in_place_refusal(group)

    def free(self, record: Record, run: DestroyRun) -> None:
        registered = channel.registration()
        swap.refresh_timeout(registered)
        release(c10d._get_default_group(), "WORLD")
        record.move(State.DESTROYED)

    def phase(self, step: DestroyStep | ReloadStep) -> str:
        return "swap" if isinstance(step, ReloadStep) else super().phase(step)

    def rebuild(self, record: Record, run: ReloadRun) -> None:
        rebuild(c10d._get_default_group(), "WORLD", channel.registration().timeout)
        record.move(State.LIVE)
        run.rebuilt.append(c10d._get_default_group())


class _SleepsSuspended(_World):
    """WORLD as the suspend ways take it."""

    def world_refusal(
        self, group: Any, backend: str, named: bool, chosen: tuple[str, ...] | None
    ) -> str | None:
        """Suspended where it can; a WORLD on CPU backends only, not named and holding no
        accelerator memory as torch registers it, stays awake, as gloo groups do."""
        found = capability(group)
        refusal = suspend_refusal(group, found)
        awake = found.cpu_only and not named and not holds_accelerator_memory(backend)
        return AWAKE if refusal is not None and awake else refusal

    def world_strict_error(self, group: Any, backend: str, refusal: str) -> ModeRefusedError:
        return ModeRefusedError(
            f"{MODE_ENV}=suspend (or set_reload_mode('suspend')) but WORLD ({backend}) "
            f"cannot be suspended in place: {refusal}; use mode 'auto' to swap it for a "
            "temporary WORLD instead"
        )


class WorldSuspend(_SleepsSuspended, Suspend):
    """WORLD suspended in place, torch's own default group guarded by a pre-hook."""

    name: ClassVar[str] = "WORLD suspended in place"


class WorldSuspendWrapped(_SleepsSuspended, SuspendWrapped):
    """WORLD suspended in place behind its stand-in (torch 2.13)."""

    name: ClassVar[str] = "WORLD suspended behind its stand-in"

    def fallback_step(self) -> DestroyStep:
        return DestroyStep.KEEP_RESIDENT  # WORLD is never destroyed here: it stays awake

    def free_step(self) -> DestroyStep:
        return DestroyStep.KEEP_RESIDENT  # nor freed behind its stand-in


SWAP = register(WorldSwap())
IN_PLACE = register(WorldInPlace())
SUSPEND = register(WorldSuspend())
SUSPEND_WRAPPED = register(WorldSuspendWrapped())


#: WORLD's way for each way a mode may choose for a group (exactly that class: a mode whose
#: ways have no WORLD way keeps WORLD awake).
STANDS_FOR: dict[type, Way] = {
    Wrapper: SWAP,
    InPlace: IN_PLACE,
    Suspend: SUSPEND,
    SuspendWrapped: SUSPEND_WRAPPED,
}


def choose(default_group: Any, backend: str, named: bool, chosen: tuple[str, ...] | None) -> Any:
    """WORLD's way, per the mode in force (None: it stays awake, as it is).

    The mode's own ways, in its order (``ways.candidates_for``, which also keeps a one-rank
    WORLD from suspending in ``auto``), each as WORLD takes it: suspended where the backend can;
    in place where torch can; swapped when its backend holds accelerator memory (or is named
    in ``accelerator_backends``). A WORLD whose backends serve the CPU only, not named and
    holding no accelerator memory as torch registers it, stays awake, as gloo groups do. A
    mode with one way refuses a WORLD that way cannot take.
    """
    candidates = group_ways.candidates_for(default_group)
    for candidate in candidates:
        world_way = STANDS_FOR.get(type(candidate))
        if world_way is None:
            continue  # no WORLD way stands for it: WORLD stays awake under it
        refusal = world_way.world_refusal(default_group, backend, named, chosen)
        if refusal is None:
            return world_way
        if refusal is AWAKE:
            return None
        if len(candidates) == 1:
            raise world_way.world_strict_error(default_group, backend, refusal)
    return None
