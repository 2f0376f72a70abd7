"""Real gloo collectives on two ranks: reloadable groups behave like native ones."""

from __future__ import annotations

import pytest

from tests.support import collective_suite
from tests.support.ranks import Rank, run_ranks

pytestmark = pytest.mark.timeout(180)


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


def test_old_method_names_fail_on_this_torch_and_work_through_the_patch() -> None:
    for rank, result in enumerate(run_ranks(_old_names_wrapper, 2)):
        # The bug is real: the trampoline finds no all_gather_single override.
        assert "No backend type associated with device type cpu" in result["unpatched_old_names"]
        assert result["unpatched_ours"] == [0.0, 0.0, 1.0, 1.0]
        assert result["unpatched_ours_rs"] == [[1.0, 3.0], [5.0, 7.0]][rank]
        assert result["patched_old_names"] == [0.0, 0.0, 1.0, 1.0]
