"""A second patch layered on top of ours (slime's actor does that): both layers keep working."""

from __future__ import annotations

import pytest

from tests.support.programs import slime_like
from tests.support.ranks import Rank, run_ranks

pytestmark = pytest.mark.timeout(180)


def _layered(ctx: Rank) -> dict:
    import torch

    import reloadpg_autopatch
    from reloadpg_autopatch.groups import registry

    dist = ctx.patched()
    ours = dist.new_group([0, 1])
    bound_all_gather = dist.all_gather_into_tensor  # a Megatron-style binding of our wrapper
    records_before = len(registry.records())

    slime_class, slime_destroy, slime_reload = slime_like.apply()
    theirs = dist.new_group([0, 1])
    their_sub, _ = dist.new_subgroups(2)  # torch's helper creates through the outer new_group
    out = {
        "their_subgroup_type": type(their_sub).__name__,
        "theirs_type": type(theirs).__name__,
        "inner_type": type(theirs.group).__name__,
        "records_added": len(registry.records()) - records_before,  # not even subgroups
    }

    def gather(func, group):
        buffer = torch.zeros(4)
        func(buffer, torch.full((2,), float(ctx.rank)), group=group)
        return buffer.tolist()

    def total(group):
        t = torch.tensor([ctx.rank + 1.0])
        dist.all_reduce(t, group=group)
        return t.item()

    out["their_group_via_their_patch"] = [
        total(theirs),
        gather(dist.all_gather_into_tensor, theirs),
    ]
    out["their_group_via_our_binding"] = gather(bound_all_gather, theirs)
    try:  # torch's own all_gather_single hands their class to the C++ trampoline
        gather(reloadpg_autopatch._originals.original("all_gather_single"), theirs)
        out["their_group_unpatched"] = "no error"
    except Exception as error:
        out["their_group_unpatched"] = type(error).__name__
    # A binding made before any patch: torch's original delegates to distributed_c10d's
    # all_gather_single by name, which is ours there, so even it works.
    out["their_group_stale_binding"] = gather(
        reloadpg_autopatch._originals.original("all_gather_into_tensor"), theirs
    )
    out["our_group_via_their_patch"] = [total(ours), gather(dist.all_gather_into_tensor, ours)]

    # Each layer destroys and reloads its own groups; neither disturbs the other.
    reloadpg_autopatch.destroy_process_groups()
    out["theirs_alive_while_ours_sleep"] = total(theirs)
    reloadpg_autopatch.reload_process_groups()
    slime_destroy()
    out["ours_alive_while_theirs_sleep"] = total(ours)
    slime_reload()
    out["after_both_reloaded"] = [total(ours), total(theirs), type(theirs.group).__name__]
    out["is_slime_class"] = isinstance(theirs, slime_class)
    return out


def test_outermost_patch_wraps_and_both_layers_keep_working() -> None:
    for report in run_ranks(_layered, 2):
        assert report["theirs_type"] == "SlimeLikeGroup"
        assert report["their_subgroup_type"] == "SlimeLikeGroup"
        assert report["inner_type"] == "ProcessGroup"  # not wrapped twice
        assert report["records_added"] == 0
        assert report["their_group_via_their_patch"] == [3.0, [0.0, 0.0, 1.0, 1.0]]
        assert report["their_group_via_our_binding"] == [0.0, 0.0, 1.0, 1.0]
        assert report["their_group_unpatched"] != "no error"  # their class alone is broken
        assert report["their_group_stale_binding"] == [0.0, 0.0, 1.0, 1.0]
        assert report["our_group_via_their_patch"] == [3.0, [0.0, 0.0, 1.0, 1.0]]
        assert report["theirs_alive_while_ours_sleep"] == 3.0
        assert report["ours_alive_while_theirs_sleep"] == 3.0
        assert report["after_both_reloaded"] == [3.0, 3.0, "ProcessGroup"]
        assert report["is_slime_class"]
