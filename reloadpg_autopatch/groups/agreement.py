"""What the ranks tell each other at a destroy and at a reload: typed answers, merged by field.

Each step has one agreement: every rank publishes its answers, the last rank to arrive merges
them, and every rank reads the one merged result (``channel.agree``: O(1) store operations
per rank, whatever the size of the world). The answers are dataclasses whose fields declare how
they merge across ranks:

- ``NAMES``: the union of group names. At scale that is every group of the world, read by
  every rank, so it travels as runs of numbers (torch names groups with a counter: ``[[0,
  17999]]``), and what each rank reads stays small as N grows;
- ``LINES``: the union of lines of text (reasons), sent the same way;
- ``FLAG``: true when any rank says so;
- ``WAYS``: each rank's ``{group: [way, size, common ways it can take]}`` for the groups it is a
  member of; merged, only the groups whose members' answers differ (happy path: nothing);
- ``BY_RANK``: each rank's ``{setting: value}``; merged, ``{setting: {value: ranks}}`` for the
  settings whose values differ between ranks (happy path: nothing);
- ``SECTIONS``: a way's own answers, a section of their own (``Section``, registered with
  ``section``): merged field by field as the rest, present only where some rank wrote one.

A way adds to its records' answers (``ways.base.Way.answer_destroy`` and ``answer_reload``),
in the shared fields or in its section; nothing else writes them, and ``exchange`` is the one
round trip both steps use.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import field
from typing import Any, ClassVar, TypeVar

from .packing import (  # noqa: F401 - the wire form, also read from here
    expand_name_sets,
    merge_name_sets,
    pack_names,
    pack_ranks,
    ranks_of,
    unpack_names,
)
from .store import channel

#: How a field merges; kept in the field's metadata.
MERGE = "merge"
UNION, ANY = "union", "any"
#: The metadata of a field of group names, or of lines of text: the union over ranks.
NAMES = LINES = {MERGE: UNION}
#: The metadata of a field that is true when any rank says so.
FLAG = {MERGE: ANY}
#: The metadata of each rank's ways per group: merged, only where the members differ.
WAYS = {MERGE: "ways"}
#: The metadata of each rank's settings: merged, only those whose values differ.
BY_RANK = {MERGE: "by rank"}
#: The metadata of the ways' own sections: each merged by its own fields.
SECTIONS = {MERGE: "sections"}
#: The common ways a group whose members' ways differ can take: freed behind its wrapper and
#: created again, or kept awake and resident on every member for the cycle.
FREE, KEEP = "f", "k"


A = TypeVar("A", bound="Answers")


@dataclasses.dataclass
class Answers:
    """One rank's answers at one step; ``merge`` combines every rank's, field by field."""

    #: The step's name in store keys and errors.
    STEP: ClassVar[str] = ""

    @classmethod
    def kinds(cls) -> dict[str, str]:
        return {f.name: f.metadata[MERGE] for f in dataclasses.fields(cls)}

    def payload(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()

    def section(self, kind: type[S]) -> S:
        """This answers' section of ``kind`` (a way's own answers), made on first use."""
        sections = self.sections  # type: ignore[attr-defined]
        found = sections.get(kind.NAME)
        if found is None:
            found = sections[kind.NAME] = kind()
        elif not isinstance(found, kind):  # read from the wire: a dict until asked for
            found = sections[kind.NAME] = kind(**found)
        return found

    @classmethod
    def merge(cls, entries: list[bytes]) -> bytes:
        """The merged answers of every rank (run by the last to arrive only)."""
        return cls.merge_ranks(list(enumerate(json.loads(entry) for entry in entries)))

    @classmethod
    def merge_ranks(cls, entries: list[tuple[int, dict[str, Any]]]) -> bytes:
        """``merge`` of ``(rank, answers)`` pairs: the ranks that answered, by number."""
        kinds = cls.kinds()
        sets: dict[str, set[str]] = {n: set() for n, k in kinds.items() if k == UNION}
        flags = {n: False for n, k in kinds.items() if k == ANY}
        per_rank: dict[str, list[Any]] = {n: [] for n, k in kinds.items() if k in MERGERS}
        for rank, entry in entries:
            for name, value in entry.items():
                if kinds[name] == ANY:
                    flags[name] = flags[name] or bool(value)
                elif kinds[name] == UNION:
                    sets[name].update(value)
                else:
                    per_rank[name].append((rank, value))
        merged: dict[str, Any] = {n: pack_names(v) for n, v in sets.items()}
        merged |= {n: MERGERS[kinds[n]](v) for n, v in per_rank.items()}
        return json.dumps(merged | flags, separators=(",", ":")).encode()

    @classmethod
    def read(cls: type[A], merged: bytes) -> A:
        return cls.from_merged(json.loads(merged))

    @classmethod
    def from_merged(cls: type[A], merged: dict[str, Any]) -> A:
        kinds = cls.kinds()
        values = {
            name: value if kinds[name] in (ANY, *MERGERS) else unpack_names(value)
            for name, value in merged.items()
        }
        if "sections" in values and kinds.get("sections") == SECTIONS[MERGE]:
            values["sections"] = read_sections(values["sections"])
        return cls(**values)


S = TypeVar("S", bound="Section")


@dataclasses.dataclass
class Section(Answers):
    """A way's own answers at a step, carried in the step's ``sections``: what only that way
    asks of the ranks stays in its room (``section`` registers a kind)."""

    #: The section's name on the wire.
    NAME: ClassVar[str] = ""


#: Every kind of section, by name: the last arriver merges each with its own fields.
_SECTIONS: dict[str, type[Section]] = {}


def section(kind: type[S]) -> type[S]:
    """Register a kind of section (a class decorator); its ``NAME`` must be new."""
    known = _SECTIONS.get(kind.NAME)
    if known is not None and known is not kind:
        raise ValueError(f"a section named {kind.NAME!r} exists already ({known.__qualname__})")
    _SECTIONS[kind.NAME] = kind
    return kind


def merge_sections(reports: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """Each section's answers merged by its own fields, over the ranks that wrote one."""
    by_name: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for rank, sections in reports:
        for name, answers in sections.items():
            by_name.setdefault(name, []).append((rank, answers))
    return {
        name: json.loads(_SECTIONS[name].merge_ranks(entries)) for name, entries in by_name.items()
    }


def read_sections(merged: dict[str, Any]) -> dict[str, Any]:
    """The merged sections, each read by its own kind."""
    return {name: _SECTIONS[name].from_merged(value) for name, value in merged.items()}


def exchange(answers: A) -> A:
    """Publish this rank's answers; return every rank's, merged, the same on every rank.

    It also gives every rank the step's fresh token (``channel.agree``).
    """
    cls = type(answers)
    return cls.read(channel.agree(cls.STEP, "agreement", answers.payload(), cls.merge))


@dataclasses.dataclass
class DestroyAnswers(Answers):
    """What a rank says at a destroy, before anything sleeps or is freed."""

    STEP: ClassVar[str] = "destroy"

    #: Groups this package did not make that WORLD's swap would reach here anyway, and why
    #: (``world.carry.obstacles``): the destroy is refused on every rank.
    untouchable: list[str] = field(default_factory=list, metadata=LINES)
    #: Every group this rank is a member of, ``{name: [way, size, common ways]}``; merged,
    #: those whose members differ: ``{name: {"size", "ways": {way: ranks}, FREE, KEEP}}``.
    ways: dict[str, Any] = field(default_factory=dict, metadata=WAYS)
    #: The settings that choose a group's way here, ``{variable: value}`` ("" unset); merged,
    #: those whose values differ: ``{variable: {value: ranks}}``.
    settings: dict[str, Any] = field(default_factory=dict, metadata=BY_RANK)
    #: The releases that raised here before the destroy (``releases``), one line each, and
    #: this rank (as a name: merged, the ranks that said so, as runs of numbers).
    release_failed: list[str] = field(default_factory=list, metadata=LINES)
    release_failed_ranks: list[str] = field(default_factory=list, metadata=NAMES)
    #: Each way's own answers, by its section's name (a suspend's: ``ways.suspend.answers``).
    sections: dict[str, Any] = field(default_factory=dict, metadata=SECTIONS)


@dataclasses.dataclass
class ReloadAnswers(Answers):
    """What a rank says at a reload, before anything is created."""

    STEP: ClassVar[str] = "reload"

    #: Groups this rank still holds: rebuilt on every rank; the others are forgotten.
    held: list[str] = field(default_factory=list, metadata=NAMES)
    #: Groups whose members create nothing (reconfigured in place, resumed, kept awake): so
    #: their non-members create nothing either.
    in_place: list[str] = field(default_factory=list, metadata=NAMES)
    #: Groups reloaded in place that this member released: they cannot be rebuilt.
    released_in_place: list[str] = field(default_factory=list, metadata=NAMES)
    #: This rank takes part in creating a group it released (and frees it after).
    takes_part: bool = field(default=False, metadata=FLAG)
    #: This rank is short of memory to resume what sleeps by suspend: one line.
    short: list[str] = field(default_factory=list, metadata=LINES)


# ---- merged per rank: only what differs travels back ----------------------------------------


def merge_ways(reports: list[tuple[int, dict[str, list[Any]]]]) -> dict[str, Any]:
    """The groups whose members would take different ways, or that some member holds no way.

    A group can then be freed behind its wrapper only when every member said so (all of them
    answered, and each can: ``FREE``), and kept awake only when every member that answered can
    (one that holds no way leaves it awake anyway: ``KEEP``).
    """
    groups: dict[str, dict[str, Any]] = {}
    for rank, ways in reports:
        for name, (way, size, common) in ways.items():
            group = groups.setdefault(name, {"size": 0, "ways": {}, FREE: True, KEEP: True})
            group["size"] = max(group["size"], int(size))
            group["ways"].setdefault(way, []).append(rank)
            group[FREE] = group[FREE] and FREE in common
            group[KEEP] = group[KEEP] and KEEP in common
    out = {}
    for name, group in groups.items():
        answered = sum(len(r) for r in group["ways"].values())
        if len(group["ways"]) > 1 or answered < group["size"]:
            group[FREE] = group[FREE] and answered >= group["size"]
            group["ways"] = {way: pack_ranks(r) for way, r in group["ways"].items()}
            out[name] = group
    return out


def merge_by_rank(reports: list[tuple[int, dict[str, str]]]) -> dict[str, Any]:
    """``{setting: {value: ranks}}`` for the settings whose values differ between ranks."""
    values: dict[str, dict[str, list[int]]] = {}
    for rank, settings in reports:
        for name, value in settings.items():
            values.setdefault(name, {}).setdefault(str(value), []).append(rank)
    return {
        name: {value: pack_ranks(ranks) for value, ranks in found.items()}
        for name, found in values.items()
        if len(found) > 1 or sum(map(len, found.values())) < len(reports)
    }


#: How each per-rank kind of field merges.
MERGERS = {
    WAYS[MERGE]: merge_ways,
    BY_RANK[MERGE]: merge_by_rank,
    SECTIONS[MERGE]: merge_sections,
}
