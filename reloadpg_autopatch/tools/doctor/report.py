"""The doctor's report: the facts each room gave, the notes and problems; the verdict and the
exit code follow from the problems alone."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ... import __version__

#: Exit codes: healthy (the gate off included), problems found, usage error (argparse's).
HEALTHY, PROBLEMS, USAGE = 0, 1, 2


@dataclass
class Report:
    """Everything the doctor found; ``problems`` decides the exit code."""

    version: str = __version__
    python: str = ""
    executable: str = ""
    site_processing: bool = True
    site_dirs: list[str] = field(default_factory=list)
    pth: dict[str, Any] = field(default_factory=dict)
    start: dict[str, Any] = field(default_factory=dict)
    #: Every copy of the package on ``sys.path`` (and the one that runs, wherever it is).
    copies: list[dict[str, Any]] = field(default_factory=list)
    gate: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    activation: dict[str, Any] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)
    torch: dict[str, Any] = field(default_factory=dict)
    stale: list[dict[str, str]] = field(default_factory=list)
    forwarding: dict[str, list[str]] = field(default_factory=dict)
    fidelity: dict[str, Any] = field(default_factory=dict)
    #: The memory guard, the reload hooks and the last cycle report of this process.
    cycle: dict[str, Any] = field(default_factory=dict)
    #: Which lifecycle the frameworks' calls reach: each lifecycle module, adopted or its own.
    adoption: dict[str, Any] = field(default_factory=dict)
    #: The groups torch knows that no cycle frees or brings back, and why (a live process).
    left_alone: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: Modules loaded when the facts were gathered (the text's "none in N loaded modules");
    #: left out of ``to_dict()``, whose keys stay those of 0.3.0.
    loaded_modules: int = field(default=0, metadata={"json": False})

    @property
    def verdict(self) -> str:
        if self.problems:
            return "problems found"
        return "healthy" if self.torch.get("patched") else "healthy, inactive (gate off)"

    @property
    def exit_code(self) -> int:
        return PROBLEMS if self.problems else HEALTHY

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for spec in fields(self):
            if spec.metadata.get("json") is False:
                del data[spec.name]
        data["verdict"] = self.verdict
        return data
