"""One common way for a group whose members would take different ways.

Each rank chooses a new group's way by itself (``ways.choose``), from its own mode and its own
environment: one node without ``SLIME_RELOADABLE_PG_MODE``, or with ``NCCL_CUMEM_ENABLE=0``, takes
another way than its peers, and a rank that suspends alone waits in NCCL's untimed barrier until
the watchdog ends it. So at the destroy's agreement every rank also says, per group it is a
member of, which way it holds it by and which common ways that way can take
(``agreement.FREE``, ``KEEP``), and the settings that chose it; the merge returns only the groups
and settings that differ, so the happy path reads nothing more and no round is added.

For such a group, the same on every rank: in ``suspend`` mode (on any rank) every rank raises
``ModeRefusedError`` naming the group, the ranks and the settings that differ, before anything
sleeps; otherwise every member takes the common way they all can: freed behind its wrapper and
created again (every member holds it behind a wrapper), else kept awake and resident for the
cycle; a group with no common way is refused alike.
"""

from __future__ import annotations

from ..._env import MODE_ENV
from ...errors import ModeRefusedError, format_ranks
from .. import mode
from ..agreement import FREE, KEEP, DestroyAnswers, ranks_of
from ..decisions import DestroyStep
from ..record import Record, State
from ..runs import DestroyRun
from ..store import channel

#: The step each common way gives a member.
STEPS = {FREE: DestroyStep.FREE_WRAPPED, KEEP: DestroyStep.KEEP_RESIDENT}
#: The mode that allows one way only, so a group some member holds another way is refused.
STRICT = "suspend"


def answer(record: Record, answers: DestroyAnswers) -> None:
    """Say which way this member holds ``record`` by, and what common ways that way can take."""
    if not record.member or record.state in (State.ENDED, State.NON_MEMBER):
        return  # a released or broken group is still its members': its peers count it
    try:
        size = int(record.native.size())
    except Exception:  # torch no longer knows it here; its peers say how many they are
        size = 0
    answers.ways[str(record.name)] = [record.way.name, size, record.way.common_ways()]


def answer_for_rank(answers: DestroyAnswers) -> None:
    """The mode is a setting that chooses every group's way."""
    answers.settings[MODE_ENV] = mode.get_reload_mode()


def _setting(variable: str, value: str, ranks: list[int]) -> str:
    shown = f"{variable}={value}" if value else f"{variable} unset"
    return f"{shown} on ranks {format_ranks(ranks)}"


def _explain(agreed: DestroyAnswers, names: list[str]) -> str:
    """Each group, the ways its members hold it by, and the settings that differ."""
    parts = []
    for name in names:
        group = agreed.ways[name]
        held = [
            f"{way!r} on ranks {format_ranks(ranks_of(ranks))}"
            for way, ranks in sorted(group["ways"].items())
        ]
        answered = sum(len(ranks_of(r)) for r in group["ways"].values())
        if answered < group["size"]:
            held.append(
                f"no way on {group['size'] - answered} of its {group['size']} members (left "
                "awake, not wrapped, or refused at its creation there)"
            )
        parts.append(f"group {name!r} ({'; '.join(held)})")
    differ = [
        ", ".join(_setting(variable, value, ranks_of(r)) for value, r in sorted(values.items()))
        for variable, values in sorted(agreed.settings.items())
    ]
    settings = "; ".join(differ) if differ else "none of the settings that choose a way differs"
    return f"{', '.join(parts)}. What differs between ranks: {settings}"


def settle(run: DestroyRun) -> None:
    """Each differing group's common way, the same on every rank (``run.shared``), or the
    refusal every rank raises."""
    agreed = run.agreed
    if agreed is None or not agreed.ways:
        return
    modes = agreed.settings.get(MODE_ENV, {})
    strict = mode.get_reload_mode() == STRICT or STRICT in modes
    names = sorted(agreed.ways)
    stuck = [name for name in names if not (agreed.ways[name][FREE] or agreed.ways[name][KEEP])]
    if strict or stuck:
        why = (
            f"{MODE_ENV}=suspend (or set_reload_mode('suspend')) allows one way only"
            if strict
            else f"groups {', '.join(map(repr, stuck))} have no way every member can take"
        )
        raise ModeRefusedError(
            f"destroy_process_groups() ({channel.where('destroy')}): the ranks would take "
            f"different ways for {_explain(agreed, names)}. {why}: nothing was suspended or "
            "destroyed on any rank. Give every rank the same environment (NCCL's variables "
            "and the mode in the runtime_env of every node), or use mode 'auto' on every rank, "
            "where such a group takes one way on all of them"
        )
    run.shared = {name: FREE if agreed.ways[name][FREE] else KEEP for name in names}
