"""Fidelity of the groups and wrappers as objects and calls.

Every gloo collective on a reloadable group gives its native group's result; the method names
of slime's wrapper before torch 2.13 fail on this torch and work through the patch; a
``P2POp`` built with torch's own ``isend`` works before and after a reload; every patched
callable pickles by reference like torch's own; ``copy`` and ``deepcopy`` of a group give the
group itself, live or destroyed, whether a wrapper or torch's own object, in every mode.

Oracles: collective results on the native group and by hand, pickle round trips against the
gate-off control, object identity.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

import pytest

from tests.support import collective_suite, gated, registered_world, run_events
from tests.support.ranks import GATE, Rank, run_ranks, total

if TYPE_CHECKING:  # only a type checker sees it: the probes of the rule test name it as text
    pass

pytestmark = pytest.mark.timeout(600)

# ---- every collective, and the method names before torch 2.13 ------------------------------------


def _every_collective(ctx: Rank) -> dict:
    import reloadpg_autopatch as rpg

    dist = ctx.patched()
    group = dist.new_group([0, 1])
    assert isinstance(group, rpg.ReloadableProcessGroup), group
    return {
        "reloadable": collective_suite.exercise(group, ctx.rank),
        "native": collective_suite.exercise(group.group, ctx.rank),
        "world": collective_suite.exercise(dist.GroupMember.WORLD, ctx.rank),
    }


@pytest.mark.timeout(180)
def test_every_collective_gives_the_native_result() -> None:
    for rank, result in enumerate(run_ranks(_every_collective, 2)):
        want = collective_suite.expected(rank)
        assert result["native"] == want
        assert result["reloadable"] == result["native"]
        assert result["world"] == want


class OldNamesGroup:
    """Stand-in for slime's wrapper before torch 2.13: only the pre-2.13 method names.

    Built inside the rank (it subclasses torch's ProcessGroup, which the parent need not load).
    """

    @staticmethod
    def make(native):
        import torch.distributed as dist

        class _OldNames(dist.ProcessGroup):
            def __init__(self, group):
                super().__init__(group.rank(), group.size())
                self.group = group

            def allgather(self, *a, **k):
                return self.group.allgather(*a, **k)

            def _allgather_base(self, *a, **k):
                return self.group._allgather_base(*a, **k)

            def _reduce_scatter_base(self, *a, **k):
                return self.group._reduce_scatter_base(*a, **k)

            def allreduce(self, *a, **k):
                return self.group.allreduce(*a, **k)

            def rank(self):
                return self.group.rank()

            def size(self):
                return self.group.size()

        return _OldNames(native)


def _chain(error: BaseException) -> str:
    text = []
    while error is not None:
        text.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    return " <- ".join(text)


def _old_names_wrapper(ctx: Rank) -> dict:
    import warnings

    import torch

    warnings.simplefilter("ignore", FutureWarning)
    ctx.init()
    import torch.distributed as dist

    from reloadpg_autopatch.groups.ways.wrapper import ReloadableProcessGroup

    native = dist.new_group([0, 1])
    old = OldNamesGroup.make(native)
    out = {}
    buffer = torch.zeros(4)
    try:
        dist.all_gather_into_tensor(buffer, torch.full((2,), float(ctx.rank)), group=old)
        out["unpatched_old_names"] = "no error"
    except Exception as error:
        out["unpatched_old_names"] = _chain(error)

    # Our wrapper forwards every method of this torch, so even the unpatched function works.
    ours = ReloadableProcessGroup(native, [0, 1], ([0, 1],))
    buffer = torch.zeros(4)
    dist.all_gather_into_tensor(buffer, torch.full((2,), float(ctx.rank)), group=ours)
    out["unpatched_ours"] = buffer.tolist()
    scattered = torch.zeros(2)
    dist.reduce_scatter_tensor(scattered, torch.arange(4.0) + ctx.rank, group=ours)
    out["unpatched_ours_rs"] = scattered.tolist()

    import reloadpg_autopatch

    reloadpg_autopatch.monkey_patch_torch_dist()
    buffer = torch.zeros(4)
    dist.all_gather_into_tensor(buffer, torch.full((2,), float(ctx.rank)), group=old)
    out["patched_old_names"] = buffer.tolist()
    return out


@pytest.mark.timeout(180)
def test_old_method_names_fail_on_this_torch_and_work_through_the_patch() -> None:
    for rank, result in enumerate(run_ranks(_old_names_wrapper, 2)):
        # The bug is real: the trampoline finds no all_gather_single override.
        assert "No backend type associated with device type cpu" in result["unpatched_old_names"]
        assert result["unpatched_ours"] == [0.0, 0.0, 1.0, 1.0]
        assert result["unpatched_ours_rs"] == [[1.0, 3.0], [5.0, 7.0]][rank]
        assert result["patched_old_names"] == [0.0, 0.0, 1.0, 1.0]


# ---- a P2POp built with torch's own isend -------------------------------------------------


def _p2p_original(ctx: Rank) -> list[list[float]]:
    import inspect

    import torch

    import reloadpg_autopatch as rpg

    dist = registered_world.start(ctx)
    group = dist.new_group([0, 1])
    torch_isend = inspect.unwrap(dist.isend)
    torch_irecv = inspect.unwrap(dist.irecv)
    assert torch_isend is not dist.isend  # the gate patched it: this is torch's own
    peer = 1 - ctx.rank
    got = []
    for _ in range(2):
        out = torch.zeros(2)
        ops = [
            dist.P2POp(torch_isend, torch.tensor([ctx.rank + 10.0, 7.0]), peer, group),
            dist.P2POp(torch_irecv, out, peer, group),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        got.append(out.tolist())
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
    return got


@pytest.mark.timeout(300)
def test_p2pop_with_torchs_own_isend_before_and_after_a_reload() -> None:
    for rank, got in enumerate(run_ranks(_p2p_original, 2, env=GATE, timeout=200)):
        assert got == [[1 - rank + 10.0, 7.0]] * 2


# ---- Pickle and copy ------------------------------------------------------------------


def _pickles(ctx: Rank, names: tuple[str, ...] = ()) -> dict[str, Any]:
    import pickle

    dist, active = gated.start(ctx)
    if active:
        import reloadpg_autopatch as rpg

        rpg.set_wrap_policy("all")
        group = dist.new_group([0, 1])
        gated.reloadable(active, group)
        marked = [
            n for n, v in vars(dist).items() if callable(v) and hasattr(v, "__reloadpg_autopatch__")
        ]
        names = tuple(sorted({*names, *marked}))
    failures: dict[str, list[str]] = {}  # name -> what went wrong, one entry per stage
    for stage in gated.stages(active):
        for name in names:
            obj = getattr(dist, name)
            try:
                if pickle.loads(pickle.dumps(obj)) is not obj:  # noqa: S301 - our own bytes
                    failures.setdefault(name, []).append(f"{stage}: round trip gave another")
            except Exception as error:
                failures.setdefault(name, []).append(f"{stage}: {type(error).__name__}: {error}")
    return {"names": names, "failures": failures}


def test_wrappers_pickle_by_reference_like_torchs_own() -> None:
    """pickle finds a function by ``__module__`` + ``__qualname__``: every patched callable in
    the ``torch.distributed`` namespace (``all_reduce``, ``new_subgroups``, ``P2POp``, ...) must
    round-trip to the very same object, as torch's own do with the gate off."""
    must = ("all_reduce", "new_subgroups", "P2POp")
    ours = run_ranks(
        functools.partial(_pickles, names=must), 2, env=gated.ON, timeout=gated.RANK_TIMEOUT
    )
    names = ours[0]["names"]
    assert set(must) <= set(names), names
    assert len(names) > len(must), names
    control = run_ranks(
        functools.partial(_pickles, names=names), 2, env=gated.OFF, timeout=gated.RANK_TIMEOUT
    )
    for report in control:
        assert report["failures"] == {}, "torch's own callables must pickle: revisit the control"
    for report in ours:  # one line per callable: how many stages failed, and the first error
        lines = [
            f"{name} ({len(errors)}x): {errors[0]}" for name, errors in report["failures"].items()
        ]
        assert not lines, "\n".join(lines)


def _copies(ctx: Rank) -> list[bool]:
    import copy

    import torch

    dist, active = gated.start(ctx)
    import reloadpg_autopatch as rpg

    rpg.set_wrap_policy("all")
    group = dist.new_group([0, 1])
    gated.reloadable(active, group)
    config = {"group": group, "weights": torch.ones(2)}
    seen = []
    for _stage in gated.stages(active):
        seen.append(copy.copy(group) is group)
        seen.append(copy.deepcopy(group) is group)
        seen.append(copy.deepcopy(config)["group"] is group)
        rpg.destroy_process_groups()  # while destroyed too
        seen.append(copy.copy(group) is group and copy.deepcopy(group) is group)
        rpg.reload_process_groups()
    return seen


def test_copy_and_deepcopy_of_a_reloadable_group_give_the_group_itself() -> None:
    """Megatron deep-copies configs that hold groups; a reloadable group is a handle, so
    ``copy.copy``/``copy.deepcopy`` return it unchanged (as the package documents; torch's
    native ``ProcessGroup`` cannot be copied at all), whether live or destroyed."""
    for seen in run_ranks(_copies, 2, env=gated.ON, timeout=gated.RANK_TIMEOUT):
        assert len(seen) == 4 * (gated.CYCLES + 1)
        assert all(seen), seen


# ---- copies in every mode ------------------------------------------------------------------------


class _Holder:
    """A module-like object that keeps a group, as Megatron's configs do."""

    def __init__(self, group: Any) -> None:
        self.group = group


def _copied(group: Any) -> list[bool] | str:
    import copy

    try:
        return [
            copy.copy(group) is group,
            copy.deepcopy(group) is group,
            copy.deepcopy(_Holder(group)).group is group,
        ]
    except Exception as error:
        return f"{type(error).__name__}: {error}"


def _copies_in_every_mode(ctx: Rank) -> dict:
    import copy

    import reloadpg_autopatch as rpg

    registered = os.environ.get("TEST_WORLD") != "unregistered"
    dist = run_events.begin(ctx, registered=registered)
    out = {}
    if registered:  # copied as a handle from its registration on, before any other group
        out["world"] = _copied(dist.group.WORLD)
    pair = dist.new_group([0, 1])
    out["pair"] = _copied(pair)
    if not registered:  # torch's own WORLD: as torch's class copies once a group keeps it
        out["world"] = _copied(dist.group.WORLD)
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    out["sum"] = total(copy.deepcopy(_Holder(pair)).group, 1)
    # Whether torch's own class was taught to copy as a handle: only once a group keeps
    # torch's object, never behind wrappers alone.
    out["taught"] = "__copy__" in vars(dist.ProcessGroup)
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("mode", "world"),
    [
        ("wrapper", "registered"),
        ("native", "registered"),
        ("auto", "registered"),
        ("native", "unregistered"),
    ],
    ids=["wrapper", "native", "auto", "native-world-unregistered"],
)
def test_copying_a_group_gives_the_group_in_every_mode(mode: str, world: str) -> None:
    """Megatron deep-copies configs that hold groups: a copy is the group itself, whether a
    wrapper or torch's own object (in place, where torch can: native, and auto on gloo). torch's
    class is taught that where the program first holds torch's objects, at WORLD's registration
    or, WORLD unregistered (torch's own), at the first group's creation; behind wrappers alone
    it stays as torch made it."""
    if mode == "native" and not run_events.reconfigures():
        pytest.skip("native mode needs torch 2.14's ProcessGroup.reconfigure")
    env = {**GATE, "SLIME_RELOADABLE_PG_MODE": mode, "TEST_WORLD": world}
    for report in run_ranks(_copies_in_every_mode, 2, env=env):
        assert report["pair"] == [True, True, True], report
        assert report["world"] == [True, True, True], report
        assert report["sum"] == 2.0
        assert report["taught"] is (mode != "wrapper" and run_events.reconfigures()), report
