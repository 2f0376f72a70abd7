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
  settings whose values differ between ranks (happy path: nothing).

A way adds to its records' answers (``ways.base.Way.answer_destroy`` and ``answer_reload``);
nothing else writes them, and ``exchange`` is the one round trip both steps use.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import field
from typing import Any, ClassVar, TypeVar

from .decisions import Reports, Verdict, sleep_verdict
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

    @classmethod
    def merge(cls, entries: list[bytes]) -> bytes:
        """The merged answers of every rank (run by the last to arrive only)."""
        kinds = cls.kinds()
        sets: dict[str, set[str]] = {n: set() for n, k in kinds.items() if k == UNION}
        flags = {n: False for n, k in kinds.items() if k == ANY}
        per_rank: dict[str, list[Any]] = {n: [] for n, k in kinds.items() if k in MERGERS}
        for rank, entry in enumerate(entries):
            for name, value in json.loads(entry).items():
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
        kinds = cls.kinds()
        values = {
            name: value if kinds[name] in (ANY, *MERGERS) else unpack_names(value)
            for name, value in json.loads(merged).items()
        }
        return cls(**values)


def exchange(answers: A) -> A:
    """Publish this rank's answers; return every rank's, merged, the same on every rank.

    It also gives every rank the step's fresh token (``channel.agree``).
    """
    cls = type(answers)
    return cls.read(channel.agree(cls.STEP, "agreement", answers.payload(), cls.merge))


@dataclasses.dataclass
class DestroyAnswers(Answers):
    """What a rank says at a destroy about the groups that sleep by suspend (local calls)."""

    STEP: ClassVar[str] = "destroy"

    #: Its communicator answered ``memory_stats()``: it can suspend.
    ok: list[str] = field(default_factory=list, metadata=NAMES)
    #: It can suspend, but no communicator exists yet (NCCL initializes lazily).
    uninitialized: list[str] = field(default_factory=list, metadata=NAMES)
    #: Some backend of it cannot suspend here.
    unsupported: list[str] = field(default_factory=list, metadata=NAMES)
    #: This rank let it go (dropped, or released while awake): no peer may enter its barrier.
    released: list[str] = field(default_factory=list, metadata=NAMES)
    #: Groups this rank left awake at creation that torch still knows (``left_awake``).
    awake: list[str] = field(default_factory=list, metadata=NAMES)
    #: Why, per group, a backend cannot suspend here.
    why: list[str] = field(default_factory=list, metadata=LINES)
    #: ``auto`` mode: a suspend would free less than ``SLIME_RELOADABLE_PG_SUSPEND_MIN_FREED``
    #: of its memory here; what it would free (one line per group and figure, no rank in it);
    #: and the groups this rank could not free instead (torch's own, not rebuilt in place).
    little: list[str] = field(default_factory=list, metadata=NAMES)
    little_why: list[str] = field(default_factory=list, metadata=LINES)
    cannot_free: list[str] = field(default_factory=list, metadata=NAMES)
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

    def verdicts(self) -> dict[str, Verdict]:
        """Each asked group's verdict, from every member's answer: the same on every rank.

        A group some member left awake (its backends there serve the CPU or cannot suspend)
        stays awake on every member: nobody suspends it, and nobody destroys it either (that
        member would never take part in creating it again). A group every member left awake
        is not the agreement's business.
        """
        every = {*self.ok, *self.uninitialized, *self.unsupported, *self.released}
        released = set(self.released) | (set(self.awake) & every)
        ok, uninitialized, unsupported = (
            set(self.ok),
            set(self.uninitialized),
            set(self.unsupported),
        )
        little, cannot_free = set(self.little), set(self.cannot_free)
        return {
            name: sleep_verdict(
                Reports(
                    name in ok,
                    name in uninitialized,
                    name in unsupported,
                    name in released,
                    name in little,
                    name in cannot_free,
                )
            )
            for name in every
        }


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


def _ranks(ranks: list[int]) -> dict[str, list[Any]]:
    return pack_names({str(r) for r in ranks})


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
            group["ways"] = {way: _ranks(r) for way, r in group["ways"].items()}
            out[name] = group
    return out


def merge_by_rank(reports: list[tuple[int, dict[str, str]]]) -> dict[str, Any]:
    """``{setting: {value: ranks}}`` for the settings whose values differ between ranks."""
    values: dict[str, dict[str, list[int]]] = {}
    for rank, settings in reports:
        for name, value in settings.items():
            values.setdefault(name, {}).setdefault(str(value), []).append(rank)
    return {
        name: {value: _ranks(ranks) for value, ranks in found.items()}
        for name, found in values.items()
        if len(found) > 1 or sum(map(len, found.values())) < len(reports)
    }


#: How each per-rank kind of field merges.
MERGERS = {WAYS[MERGE]: merge_ways, BY_RANK[MERGE]: merge_by_rank}


def ranks_of(packed: dict[str, list[Any]]) -> list[int]:
    """The ranks ``merge_ways`` or ``merge_by_rank`` packed."""
    return sorted(int(r) for r in unpack_names(packed))


# ---- the wire form: names as runs of numbers ----------------------------------------------


def pack_names(names: set[str]) -> dict[str, list[Any]]:
    """``names`` with decimal ones (torch's group names are a counter) packed into runs."""
    numbers = sorted(int(n) for n in names if n.isascii() and n.isdigit() and str(int(n)) == n)
    runs: list[list[int]] = []
    for number in numbers:
        if runs and runs[-1][1] == number - 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    packed = {str(n) for n in numbers}
    return {"runs": runs, "names": sorted(names - packed)}


def unpack_names(packed: dict[str, list[Any]]) -> list[str]:
    out = [str(n) for first, last in packed["runs"] for n in range(first, last + 1)]
    return out + list(packed["names"])


def merge_name_sets(entries: list[bytes]) -> bytes:
    """Untyped answers merged by value: a list becomes the union, a boolean the ``any`` (the
    same wire form as ``Answers.merge``, for tools that build their own answers)."""
    sets: dict[str, set[str]] = {}
    flags: dict[str, bool] = {}
    for entry in entries:
        for name, value in json.loads(entry).items():
            if isinstance(value, bool):
                flags[name] = flags.get(name, False) or value
            else:
                sets.setdefault(name, set()).update(value)
    merged: dict[str, Any] = {name: pack_names(values) for name, values in sets.items()}
    return json.dumps(merged | flags, separators=(",", ":")).encode()


def expand_name_sets(merged: bytes) -> dict[str, Any]:
    """The object ``merge_name_sets`` packed: lists of names and booleans again."""
    return {
        name: value if isinstance(value, bool) else unpack_names(value)
        for name, value in json.loads(merged).items()
    }
