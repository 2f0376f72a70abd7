"""Memory probes a test hands the package (``set_memory_probe``).

CPU has no accelerator memory to query, so the guard's and the report's figures are the test's:
the one fake of the guard tests, because nothing real can be measured on CPU. ``GcRuns``
counts the collector's runs while automatic collection is off (each one an explicit
``gc.collect()``); ``TimelineProbe`` records each query and each clear with the collector's
count by then; ``EventProbe`` logs queries and clears.
"""

from __future__ import annotations

from typing import Any

GiB = 2**30


class GcRuns:
    """Counts the collector's runs (``gc.callbacks``' start phase) while it is disabled.

    With automatic collection off, every run seen is an explicit ``gc.collect()``.
    """

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.count += 1

    def __enter__(self) -> GcRuns:
        import gc

        gc.collect()  # nothing left over for a later run to be blamed on
        gc.disable()
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        import gc

        gc.callbacks.remove(self)
        gc.enable()


class TimelineProbe:
    """The test's memory probe: returns figures the test chooses and counts every call.

    ``timeline`` records each query and each clear with how many times the collector had run
    by then, so that a test sees ``gc.collect()`` run between a low reading and its clear.
    ``step`` bytes are added to ``free`` per query, so that every reading is distinct.
    """

    def __init__(
        self, gc_runs: GcRuns, free_gib: float, total_gib: float = 80.0, step: int = 0
    ) -> None:
        self.gc_runs = gc_runs
        self.free_gib = free_gib
        self.total_gib = total_gib
        self.step = step
        self.timeline: list[tuple[str, str, int]] = []  # (what, device type, gc runs)
        self.returned: list[Any] = []

    @property
    def calls(self) -> list[tuple[str, str, int]]:
        return [event for event in self.timeline if event[0] == "probe"]

    @property
    def clears(self) -> list[tuple[str, str, int]]:
        return [event for event in self.timeline if event[0] == "clear"]

    def figures(self) -> Any:
        import reloadpg_autopatch as rpg

        return rpg.MemoryFigures(
            free=int(self.free_gib * GiB) + self.step * len(self.returned),
            total=int(self.total_gib * GiB),
            allocated=int(0.25 * self.total_gib * GiB),
            reserved=int(0.5 * self.total_gib * GiB),
        )

    def __call__(self, device: Any) -> Any:
        self.timeline.append(("probe", device.type, self.gc_runs.count))
        figures = self.figures()
        self.returned.append(figures)
        return figures

    def clear(self, device: Any) -> None:
        self.timeline.append(("clear", device.type, self.gc_runs.count))

    def install(self) -> None:
        import reloadpg_autopatch as rpg

        rpg.set_memory_probe(self, device_types=("cpu",), clear=self.clear)

    def mark(self) -> tuple[int, int]:
        return len(self.timeline), self.gc_runs.count

    def since(self, mark: tuple[int, int]) -> dict[str, int]:
        events, runs = mark
        later = [what for what, _, _ in self.timeline[events:]]
        return {
            "probe": later.count("probe"),
            "clear": later.count("clear"),
            "gc": self.gc_runs.count - runs,
        }

    def collected_before_each_clear(self, start: int) -> bool:
        """Whether every clear from ``start`` on came after a run of the collector that came
        after the query before it."""
        last_query = None
        for what, _, runs in self.timeline[start:]:
            if what == "probe":
                last_query = runs
            elif last_query is None or runs <= last_query:
                return False
        return True

    def devices(self, start: int) -> list[str]:
        return sorted({kind for _, kind, _ in self.timeline[start:]})


class EventProbe:
    """The test's memory probe: figures it chooses, and a log of every query and clear."""

    def __init__(self, gc_runs: GcRuns | None = None, free: int = 10 * GiB) -> None:
        self.gc_runs = gc_runs
        self.free = free
        #: Added to ``free`` per query already answered, so that readings differ.
        self.step = 0
        self.events: list[str] = []
        self.returned: list[Any] = []

    def __call__(self, device: Any) -> Any:
        import reloadpg_autopatch as rpg

        self.events.append("probe")
        figures = rpg.MemoryFigures(
            free=self.free + self.step * len(self.returned),
            total=80 * GiB,
            allocated=17 * GiB + 3,
            reserved=29 * GiB + 5,
        )
        self.returned.append(figures)
        return figures

    def clear(self, device: Any) -> None:
        self.events.append("clear")

    def install(self) -> None:
        import reloadpg_autopatch as rpg

        rpg.set_memory_probe(self, device_types=("cpu",), clear=self.clear)

    def mark(self) -> tuple[int, int]:
        return len(self.events), self.gc_runs.count if self.gc_runs else 0

    def since(self, mark: tuple[int, int]) -> dict[str, int]:
        later = self.events[mark[0] :]
        runs = (self.gc_runs.count if self.gc_runs else 0) - mark[1]
        return {"probe": later.count("probe"), "clear": later.count("clear"), "gc": runs}
