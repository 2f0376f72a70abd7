"""The errors a program can catch by type, under one base that is a ``RuntimeError``.

Every failure of a lifecycle step that this package raises itself is a ``ReloadPGError``, so
``except RuntimeError`` keeps catching it, ``except ReloadPGError`` catches only ours, and the
subclasses name the cases a program handles differently (a peer that never came, a group used
while it sleeps, a hook that failed...). Each class has a ``slug``: a short stable name for logs
and dashboards. Bad arguments stay ``TypeError`` and ``ValueError``, as Python's own do.

It imports nothing, like ``_env``: ``import reloadpg_autopatch`` may name these without torch.
"""

TYPE_CHECKING = False  # typing is not loaded here; type checkers read this name
if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "GroupBrokenError",
    "GroupDestroyedError",
    "GroupSuspendedError",
    "MemoryShortError",
    "ModeRefusedError",
    "PeerMissingError",
    "RegistrationError",
    "ReleaseError",
    "ReloadHookError",
    "ReloadPGError",
    "StepInProgressError",
    "TransitionError",
    "WorldLostError",
    "format_ranks",
]

#: How many ranks a message lists before it says "...".
SHOWN_RANKS = 32


def format_ranks(ranks: "Iterable[int]") -> str:
    """``"1, 3, 5"``, cut after ``SHOWN_RANKS`` ranks: the one way messages list ranks."""
    ranks = list(ranks)
    shown = ", ".join(str(r) for r in ranks[:SHOWN_RANKS])
    return shown + (f" ... ({len(ranks)} ranks)" if len(ranks) > SHOWN_RANKS else "")


class ReloadPGError(RuntimeError):
    """A step of this package could not be done; the message says what, why and what to do."""

    slug = "reloadpg"


class PeerMissingError(ReloadPGError):
    """A rank did not reach a step that needs every rank (a store sync, a group's creation).

    ``missing`` lists the ranks that never arrived (empty when nobody can tell, for instance
    when the store itself is gone); ``step`` names the step.
    """

    slug = "peer-missing"

    def __init__(self, message: str, missing: "Iterable[int]" = (), step: str = "") -> None:
        super().__init__(message)
        self.missing = list(missing)
        self.step = step


class GroupDestroyedError(ReloadPGError):
    """A group was used while it has no communicator: destroyed, released, or of an ended WORLD."""

    slug = "group-destroyed"


class GroupSuspendedError(GroupDestroyedError):
    """A group was used while its communicator is suspended (``suspend`` mode)."""

    slug = "group-suspended"


class GroupBrokenError(ReloadPGError):
    """A group's communicator failed half-way through a suspend or resume: it cannot be used."""

    slug = "group-broken"


class ReloadHookError(ReloadPGError):
    """A reload hook raised; the destroy or reload it ran in completed on this rank."""

    slug = "reload-hook"


class ReleaseError(ReloadPGError):
    """A release of what borrows a communicator (Megatron's teardown callbacks, NCCL EP's
    finalize) raised before a destroy: nothing was freed or suspended on any rank."""

    slug = "release"


class ModeRefusedError(ReloadPGError):
    """The reload mode in force (``native``, ``suspend``) cannot reload a group as it asks."""

    slug = "mode-refused"


class RegistrationError(ReloadPGError):
    """WORLD's registration conflicts with one already made for this WORLD."""

    slug = "registration"


class StepInProgressError(ReloadPGError):
    """A destroy or reload was called while one is running (another thread, or a hook)."""

    slug = "step-in-progress"


class WorldLostError(ReloadPGError):
    """A step failed after WORLD was gone: this world cannot be reloaded, only started again.

    Raised from the failure that lost it; ``missing`` repeats the ranks that never came, if
    that was the cause.
    """

    slug = "world-lost"

    def __init__(self, message: str, missing: "Iterable[int]" = ()) -> None:
        super().__init__(message)
        self.missing = list(missing)


class MemoryShortError(ReloadPGError):
    """Some rank lacks the accelerator memory to resume its groups; nothing was resumed."""

    slug = "memory-short"


class TransitionError(ReloadPGError):
    """A lifecycle step tried a move its transition table does not allow (a bug of ours)."""

    slug = "transition"
