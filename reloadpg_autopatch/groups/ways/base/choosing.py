"""How a way is chosen for a new group, and how it explains itself (``ways.choose``, the doctor)."""

from __future__ import annotations

from typing import Any, ClassVar

from ....errors import ModeRefusedError


class Choosing:
    """What a way is, whether it can take a group, and its words for the doctor."""

    #: How reports, errors and the doctor name it.
    name: ClassVar[str] = "?"
    #: The program holds torch's own group object (no wrapper).
    torch_object: ClassVar[bool] = False
    #: Reload rebuilds the communicator inside torch's own object (native mode).
    in_place: ClassVar[bool] = False
    #: It answers at the destroy's agreement whether it can suspend.
    suspends: ClassVar[bool] = False
    #: Its free comes after every other one of a destroy (its swap tears down every group).
    frees_last: ClassVar[bool] = False
    #: Each reload makes a new native group for it (behind its wrapper): nothing that tears
    #: every group down between a destroy and a reload can break it.
    makes_anew: ClassVar[bool] = False

    def available(self) -> bool:
        """Whether this torch can do it at all."""
        return True

    def refusal(self, group: Any) -> str | None:
        """Why this way cannot take ``group`` (None: it can)."""
        return None

    def stays_awake(self, group: Any) -> bool:
        """Whether a group it cannot take is left alone, awake, rather than refused."""
        return False

    def strict_error(self, name: str, refusal: str) -> ModeRefusedError:
        """The error of a mode that allows only this way, for a group it cannot take."""
        return ModeRefusedError(f"group {name!r} cannot be reloaded {self.name}: {refusal}")

    def explain(self) -> str:
        """What it does, for the doctor."""
        return self.name

    def cannot(self, why: str) -> str:
        """The doctor's words for why it did not take a group another way took."""
        return f"; not {self.name}: {why}"

    def problem(self, backend: str, why: str) -> str:
        """The doctor's problem line when a mode with this way alone refuses ``backend``."""
        return f"{self.name} cannot take {backend} groups: {why}"
