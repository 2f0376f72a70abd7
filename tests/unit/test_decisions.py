"""The lifecycle's decisions, in one process, over every combination of their inputs.

``decisions.destroy_step`` and ``decisions.reload_step`` are pure: what a destroy or a reload does
with a record follows from the record's facts and the ranks' agreement alone. Each is compared
here with this file's own table, written from the documented behaviour, for the whole product
of its inputs; every step's move must be one the record's transition table allows; and the
process's phase table is checked pair by pair. Spawned-rank tests show the same steps end to
end; these show that no combination was forgotten.
"""

from __future__ import annotations

import itertools

import pytest

from reloadpg_autopatch.groups import destroy, reload
from reloadpg_autopatch.groups.decisions import (
    DestroyFacts,
    DestroyStep,
    ReloadFacts,
    ReloadStep,
    destroy_step,
    reload_step,
)
from reloadpg_autopatch.groups.process import PHASES, Phase, ProcessState
from reloadpg_autopatch.groups.record import TRANSITIONS, State, TransitionError
from reloadpg_autopatch.groups.ways import Builtin as Way
from reloadpg_autopatch.groups.ways.suspend.verdicts import Reports, sleep_verdict
from reloadpg_autopatch.groups.ways.suspend.verdicts import Verdict as Sleep

# ---- the expected tables, written from the documented behaviour ---------------------------


#: Ways the program holds a wrapper in (the others: torch's own object, never "dropped").
WRAPPED = (Way.WRAPPER, Way.SUSPEND_WRAPPED)


def expected_destroy(f: DestroyFacts) -> DestroyStep:
    """A destroy frees what this rank holds live, and lets go of what the program dropped.

    A group that sleeps by suspend does what the ranks agreed: suspended, guarded only, kept
    resident; a fallback destroys it where a wrapper stands for it, and keeps torch's own
    object resident (nothing can destroy an object the program holds).
    """
    dropped_wrapper = f.abandoned and f.way in WRAPPED
    if dropped_wrapper and f.state in (State.LIVE, State.DESTROYED):
        return DestroyStep.RELEASE_ABANDONED
    if f.state is not State.LIVE:
        return DestroyStep.NOTHING
    if f.way is Way.IN_PLACE:
        return DestroyStep.FREE_IN_PLACE
    if f.way is Way.WRAPPER:
        return DestroyStep.FREE_WRAPPED
    agreed = {
        Sleep.SUSPEND: DestroyStep.SUSPEND,
        Sleep.GUARD: DestroyStep.GUARD,
        Sleep.RESIDENT: DestroyStep.KEEP_RESIDENT,
    }
    if f.verdict in agreed:
        return agreed[f.verdict]
    if f.verdict is Sleep.FREE:  # a suspend would give back little (auto): freed instead
        return (
            DestroyStep.FREE_WRAPPED if f.way is Way.SUSPEND_WRAPPED else DestroyStep.FREE_IN_PLACE
        )
    # A fallback, or no verdict (made while asleep: nobody was asked).
    return DestroyStep.FREE_WRAPPED if f.way is Way.SUSPEND_WRAPPED else DestroyStep.KEEP_RESIDENT


#: A reload, case by case: (state, in place?) -> the step, or a rule over the agreement.
def expected_reload(f: ReloadFacts) -> ReloadStep:
    in_place = f.way is Way.IN_PLACE
    # Torch's own object freed instead of suspended (auto mode) was freed in place.
    freed_in_place = in_place or (f.way is Way.SUSPEND and f.state is State.DESTROYED)
    table = {
        # Ended: never used again.
        (State.ENDED, False): ReloadStep.NOTHING,
        (State.ENDED, True): ReloadStep.NOTHING,
    }
    if (f.state, in_place) in table:
        return table[(f.state, in_place)]
    if f.state is State.BROKEN:  # half-suspended or half-resumed: nothing may touch it
        return ReloadStep.NOTHING
    if f.state is State.SUSPENDED:  # every member resumes it; then a pending release
        if f.way not in (Way.SUSPEND, Way.SUSPEND_WRAPPED):
            return ReloadStep.NOTHING  # a way that never suspends has nothing to resume
        return ReloadStep.RESUME_THEN_RELEASE if f.release_pending else ReloadStep.RESUME
    if f.state in (State.RELEASED, State.NON_MEMBER):
        # Not this rank's to hold. Nobody holds it: forgotten everywhere at once.
        if not f.needed:
            return ReloadStep.FORGET
        # Released here although in place: a peer needs it, and it cannot be rebuilt.
        if in_place:
            return ReloadStep.REFUSE_RELEASED_HERE
        # Its members reconfigure, resume or keep it themselves: nothing for a non-member,
        # or for a rank that released a group that sleeps by suspend, to create.
        suspends = f.way in (Way.SUSPEND, Way.SUSPEND_WRAPPED)
        if f.peers_in_place and (f.state is State.NON_MEMBER or suspends):
            return ReloadStep.LEAVE_TO_MEMBERS
        return ReloadStep.TAKE_PART  # torch creates groups collectively
    if f.state is State.LIVE:  # made while asleep
        if f.torn_down:  # WORLD's restore tore it down with every group
            # Made again behind its wrapper; torch's own object cannot be: refused.
            torch_object = f.way in (Way.IN_PLACE, Way.SUSPEND)
            return (
                ReloadStep.REFUSE_TORN_DOWN if torch_object else ReloadStep.RECREATE_AFTER_RESTORE
            )
        return ReloadStep.NOTHING
    assert f.state is State.DESTROYED
    if not freed_in_place:
        return ReloadStep.RECREATE
    if f.torn_down:
        return ReloadStep.REFUSE_TORN_DOWN
    if f.released_by_a_member:
        return ReloadStep.REFUSE_RELEASED_BY_A_MEMBER
    return ReloadStep.REBUILD_IN_PLACE


BOOLS = (False, True)
VERDICTS = (None, *Sleep)
ALL_DESTROY = [DestroyFacts(*c) for c in itertools.product(State, Way, BOOLS, VERDICTS)]
ALL_RELOAD = [
    ReloadFacts(*c) for c in itertools.product(State, Way, BOOLS, BOOLS, BOOLS, BOOLS, BOOLS)
]


def _mismatches(decide, expect, combinations) -> list[str]:
    return [
        f"{facts}: got {decide(facts)}, expected {expect(facts)}"
        for facts in combinations
        if decide(facts) is not expect(facts)
    ]


def test_every_destroy_combination_takes_the_documented_step() -> None:
    assert len(ALL_DESTROY) == len(State) * len(Way) * 2 * (len(Sleep) + 1)
    assert _mismatches(destroy_step, expected_destroy, ALL_DESTROY) == []


def test_every_reload_combination_takes_the_documented_step() -> None:
    assert len(ALL_RELOAD) == len(State) * len(Way) * 32
    assert _mismatches(reload_step, expected_reload, ALL_RELOAD) == []


def test_a_wrong_entry_in_a_decision_is_caught() -> None:
    """The comparison can fail: one combination answered wrongly is reported, and only it."""
    wrong = ReloadFacts(State.DESTROYED, Way.WRAPPER, False, True, False, False, False)

    def broken(facts: ReloadFacts) -> ReloadStep:
        return ReloadStep.TAKE_PART if facts == wrong else reload_step(facts)

    found = _mismatches(broken, expected_reload, ALL_RELOAD)
    assert len(found) == 1, found
    assert "RECREATE" in found[0], found


def expected_verdict(r: Reports) -> Sleep:
    """What the ranks' answers about one group mean, the same on every rank."""
    if r.released:  # a member let go: a suspend would wait for it in NCCL's barrier
        return Sleep.RESIDENT
    if r.unsupported:
        return Sleep.FALLBACK
    if r.ok and r.uninitialized:  # the members disagree
        return Sleep.FALLBACK
    if r.uninitialized:
        return Sleep.GUARD
    if not r.ok:
        return Sleep.FALLBACK
    # Some member's suspend would free little of its memory (auto mode), and every member
    # can free it instead (behind its wrapper, or in place): freed; else suspended anyway.
    return Sleep.FREE if r.little and not r.cannot_free else Sleep.SUSPEND


def test_every_combination_of_answers_gives_the_documented_verdict() -> None:
    every = [Reports(*c) for c in itertools.product(BOOLS, repeat=6)]
    assert _mismatches(sleep_verdict, expected_verdict, every) == []


# ---- each step's move is one the record's table allows --------------------------------------

#: The state a step leaves the record in (None: the state stays, or the step raises).
DESTROY_MOVES = {
    DestroyStep.NOTHING: None,
    DestroyStep.RELEASE_ABANDONED: State.RELEASED,
    DestroyStep.FREE_WRAPPED: State.DESTROYED,
    DestroyStep.FREE_IN_PLACE: State.DESTROYED,
    DestroyStep.SUSPEND: State.SUSPENDED,
    DestroyStep.GUARD: State.SUSPENDED,
    DestroyStep.KEEP_RESIDENT: None,
}
RELOAD_MOVES = {
    ReloadStep.NOTHING: None,
    ReloadStep.FORGET: State.ENDED,
    ReloadStep.RECREATE: State.LIVE,
    ReloadStep.RECREATE_AFTER_RESTORE: State.LIVE,  # through DESTROYED
    ReloadStep.REBUILD_IN_PLACE: State.LIVE,
    ReloadStep.TAKE_PART: None,
    ReloadStep.LEAVE_TO_MEMBERS: None,
    ReloadStep.REFUSE_RELEASED_BY_A_MEMBER: None,
    ReloadStep.REFUSE_RELEASED_HERE: None,
    ReloadStep.REFUSE_TORN_DOWN: None,
    ReloadStep.RESUME: State.LIVE,
    ReloadStep.RESUME_THEN_RELEASE: State.RELEASED,  # through LIVE
}


def _allowed(path: list[State]) -> bool:
    return all(b in TRANSITIONS[a] for a, b in itertools.pairwise(path))


def test_every_step_moves_a_record_only_as_its_transition_table_allows() -> None:
    for facts in ALL_DESTROY:
        to = DESTROY_MOVES[destroy_step(facts)]
        if to is not None:
            assert _allowed([facts.state, to]), facts
    for facts in ALL_RELOAD:
        step = reload_step(facts)
        to = RELOAD_MOVES[step]
        if to is None:
            continue
        via = {
            ReloadStep.RECREATE_AFTER_RESTORE: [State.DESTROYED],
            ReloadStep.RESUME_THEN_RELEASE: [State.LIVE],
        }.get(step, [])
        assert _allowed([facts.state, *via, to]), (facts, step)


class _Recorder:
    """A way whose every step method records its own name (the drivers' dispatch, seen)."""

    def __init__(self) -> None:
        self.called: list[str] = []

    def phase(self, step: object) -> str:
        return "test"

    def __getattr__(self, name: str) -> object:
        return lambda record, run: self.called.append(name)


def test_the_drivers_call_each_steps_method_directly() -> None:
    """``destroy._carry_out`` and ``reload._carry_out`` call, for every step, the method the
    steps' table names (``ways.base.steps``), and nothing else."""
    from reloadpg_autopatch.groups.runs import DestroyRun, ReloadRun
    from reloadpg_autopatch.groups.ways.base import steps

    assert set(steps.DESTROY) == set(DestroyStep)
    assert set(steps.RELOAD) == set(ReloadStep)
    for table, carry_out, run in (
        (steps.DESTROY, destroy._carry_out, DestroyRun()),
        (steps.RELOAD, reload._carry_out, ReloadRun()),
    ):
        for step, method in table.items():
            way = _Recorder()
            record = type("R", (), {"way": way})()
            carry_out(record, step, run)
            assert way.called == [method.__name__], (step, way.called)
    assert set(DESTROY_MOVES) == set(DestroyStep)
    assert set(RELOAD_MOVES) == set(ReloadStep)


# ---- the process's phases --------------------------------------------------------------------

#: Written from the documented cycle: destroy, asleep, reload; a failed destroy that freed
#: nothing is awake again; a failed reload stays asleep; a destroy while asleep is allowed.
EXPECTED_PHASES = {
    (Phase.AWAKE, Phase.DESTROYING),
    (Phase.DESTROYING, Phase.ASLEEP),
    (Phase.DESTROYING, Phase.AWAKE),
    (Phase.ASLEEP, Phase.RELOADING),
    (Phase.ASLEEP, Phase.DESTROYING),
    (Phase.RELOADING, Phase.AWAKE),
    (Phase.RELOADING, Phase.ASLEEP),
}


@pytest.mark.parametrize(("start", "end"), list(itertools.product(Phase, Phase)))
def test_the_process_moves_only_between_the_documented_phases(start: Phase, end: Phase) -> None:
    assert ((start, end) in EXPECTED_PHASES) == (end in PHASES[start])
    holder = ProcessState()
    holder.phase = start
    if (start, end) in EXPECTED_PHASES:
        holder.move(end)
        assert holder.phase is end
    else:
        with pytest.raises(TransitionError, match=f"from {start.value} to {end.value}"):
            holder.move(end)
        assert holder.phase is start


def test_keys_come_from_the_cycle_and_the_step_only() -> None:
    """Two holders with different histories (worlds ended, reports) derive the same keys."""
    survivor, fresh = ProcessState(), ProcessState()
    survivor.worlds_ended, survivor.last_report = 3, object()
    for holder in (survivor, fresh):
        holder.cycle, holder.attempt = 2, 1
    assert survivor.key("destroy", "sync", "destroy") == fresh.key("destroy", "sync", "destroy")
    assert survivor.key("reload", "agree") == fresh.key("reload", "agree")
    keys = {
        fresh.key("destroy", "world", "gloo"),
        fresh.key("reload", "world", "gloo"),
    }
    fresh.attempt = 2  # a reload called again after a refusal
    keys.add(fresh.key("reload", "world", "gloo"))
    fresh.cycle = 3
    keys.add(fresh.key("destroy", "world", "gloo"))
    assert len(keys) == 4, keys


# ---- WORLD's ways: the same table, but for what WORLD is --------------------------------------

from reloadpg_autopatch.groups.world import ways as world_ways  # noqa: E402

#: Each of WORLD's ways and the group way whose table it follows.
WORLD_AS = {
    world_ways.SWAP: Way.WRAPPER,
    world_ways.IN_PLACE: Way.IN_PLACE,
    world_ways.SUSPEND: Way.SUSPEND,
    world_ways.SUSPEND_WRAPPED: Way.SUSPEND_WRAPPED,
}


def expected_world_destroy(f: DestroyFacts) -> DestroyStep:
    """As its group way, except that WORLD is never destroyed by a suspend's fallback (it stays
    awake, resident): nothing can stand in for WORLD while it would be re-created."""
    step = expected_destroy(f._replace(way=WORLD_AS[f.way]))
    if f.way is world_ways.SUSPEND_WRAPPED and step is DestroyStep.FREE_WRAPPED:
        return DestroyStep.KEEP_RESIDENT
    return step


def expected_world_reload(f: ReloadFacts) -> ReloadStep:
    """As its group way, except that a live swapped WORLD has nothing to do at a reload (it
    is what restores WORLD: nothing tore it down)."""
    if f.way is world_ways.SWAP and f.state is State.LIVE:
        return ReloadStep.NOTHING
    return expected_reload(f._replace(way=WORLD_AS[f.way]))


def test_worlds_ways_take_the_documented_steps() -> None:
    world = list(WORLD_AS)
    destroys = [DestroyFacts(*c) for c in itertools.product(State, world, BOOLS, VERDICTS)]
    reloads = [
        ReloadFacts(*c) for c in itertools.product(State, world, BOOLS, BOOLS, BOOLS, BOOLS, BOOLS)
    ]
    assert _mismatches(destroy_step, expected_world_destroy, destroys) == []
    assert _mismatches(reload_step, expected_world_reload, reloads) == []


# ---- the decisions are pure: each looks at its facts and nothing else -------------------------

import ast  # noqa: E402
import inspect  # noqa: E402

from reloadpg_autopatch.groups import ways as ways_package  # noqa: E402

#: What a decision may name besides its own locals: its facts, its way, the steps' vocabulary.
PURE_NAMES = {"self", "facts", "DestroyStep", "ReloadStep", "Verdict", "State", "super"}
#: What a decision may raise: that it is not written yet (the interface's own).
PURE_NAMES |= {"NotImplementedError"}


def _impurities(function: object) -> list[str]:
    source = inspect.getsource(function)
    tree = ast.parse(source.replace("\n    ", "\n")[source.index("def") :])
    body = tree.body[0]
    local = {a.arg for a in body.args.args} | {
        t.id
        for n in ast.walk(body)
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    nodes = [n for statement in body.body for n in ast.walk(statement)]
    found = [n.id for n in nodes if isinstance(n, ast.Name) and n.id not in PURE_NAMES | local]
    for call in (n for n in nodes if isinstance(n, ast.Call)):
        name = ast.unparse(call.func)
        if not (name.endswith("_step") or name == "super"):
            found.append(f"calls {name}")
    return found


def test_every_ways_decisions_look_at_their_facts_only() -> None:
    ways = [*Way, *WORLD_AS, *ways_package.registered()]
    checked = 0
    for way in ways:
        for cls in type(way).__mro__:
            for name, member in vars(cls).items():
                if name.endswith("_step") and inspect.isfunction(member):
                    assert _impurities(member) == [], f"{cls.__name__}.{name}"
                    checked += 1
    assert checked >= 10


def test_an_impure_decision_is_caught() -> None:
    def sleep_step(self, facts):
        from reloadpg_autopatch.groups import mode

        return DestroyStep.NOTHING if mode.get_reload_mode() else facts

    assert _impurities(sleep_step) == ["mode", "calls mode.get_reload_mode"]
