"""How a way's group appears: the object held, its name in messages, its place in the report,
and the error a use of it raises while it has no native group."""

from __future__ import annotations

from typing import Any

from ....errors import GroupBrokenError, GroupDestroyedError, ReloadPGError
from ...decisions import DestroyStep, ReloadStep
from ...record import Record, State
from ...runs import DestroyRun, ReloadRun


class Appearance:
    """What the program, the report and the messages see of a way's group."""

    torch_object: bool

    def held(self, record: Record) -> Any:
        """The group object the program holds: torch's own, or the wrapper."""
        return record.native if self.torch_object else record.wrapper

    def label(self, record: Record) -> str:
        """How messages name the group: its description or name, and its ranks."""
        wrapper = record.wrapper
        if wrapper is not None:
            return wrapper.describe()
        desc = record.kwargs.get("group_desc")
        try:
            import torch.distributed as dist

            ranks = dist.get_process_group_ranks(record.native)
        except Exception:  # torch no longer knows it: the name says enough
            ranks = None
        shown = f"group {desc!r}" if desc else f"group {record.name!r}"
        return shown + (f" (ranks {ranks})" if ranks is not None else "")

    def describe(self, record: Record, ranks: list[int]) -> str:
        """How its wrapper names itself."""
        desc = record.kwargs.get("group_desc")
        label = f"'{desc}' " if desc else ""
        return f"ReloadableProcessGroup {label}(ranks {ranks})"

    def releasable(self, record: Record) -> bool:
        """Whether ``destroy_process_group(g)`` lets this group go (WORLD's ends the world)."""
        return True

    def use_error(self, record: Record, label: str, what: str) -> ReloadPGError:
        """The error for using the group while it has no native group."""
        if record.state is State.BROKEN:
            return GroupBrokenError(
                f"{label} cannot be used ({what}): its communicator was aborted when a free "
                "of its destroy outlived its deadline (a peer never came); this world cannot "
                "be reloaded: end it, and start again"
            )
        if record.state is State.ENDED and record.ended_with_world:
            return GroupDestroyedError(
                f"{label} belonged to a WORLD that was destroyed "
                "(torch.distributed.destroy_process_group()) and cannot be used "
                f"({what}); its world was destroyed: create a new group in the current world"
            )
        if record.state in (State.RELEASED, State.ENDED):
            return GroupDestroyedError(
                f"{label} was released with torch.distributed.destroy_process_group() "
                f"and cannot be used ({what}); create a new group instead"
            )
        return GroupDestroyedError(
            f"{label} is destroyed and cannot be used ({what}); call "
            "reloadpg_autopatch.reload_process_groups() on every rank first"
        )

    def phase(self, step: DestroyStep | ReloadStep) -> str:
        """The phase of the step's report that carrying out ``step`` counts under."""
        return "destroy" if isinstance(step, DestroyStep) else "creations"

    def note(self, run: DestroyRun | ReloadRun, outcome: str, record: Record) -> None:
        """Name the group under ``outcome`` in the step's report."""
        if isinstance(run, DestroyRun):
            run.destroyed.append(str(record.name))
        else:
            run.names[outcome].append(str(record.name))

    def timed(self, run: ReloadRun, record: Record, milliseconds: float) -> None:
        """What a creation (or a rebuild) of the group took, in the step's report."""
        run.part.creations[str(record.name)] = milliseconds

    def listed(self, record: Record) -> bool:
        """Whether ``reloadable_groups()`` lists it: a group the program holds that a cycle
        frees and brings back, awake or asleep by any way (so that one program sees the same
        list in every mode); not one released while it sleeps, nor a broken one."""
        kept = record.state in (State.LIVE, State.DESTROYED, State.SUSPENDED)
        return record.held is not None and kept and not record.release_pending
