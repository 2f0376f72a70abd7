"""The ways behind one interface: a way of the test's own takes part in every cycle.

``tests/support/keep_awake.py`` adds a way with one module and one ``ways.register`` call. The
lifecycle then chooses it for new groups in its mode, destroy and reload ask it what to do, the
ranks agree on its groups, and the cycle report names them, with no module of the package
changed. The oracles are torch's: the group's object identity, ``all_reduce`` results before,
between and after the cycle, and the groups torch creates (counted at its
``_new_process_group_helper``).
"""

from __future__ import annotations

from typing import Any

from tests.support.ranks import GATE, Rank, run_ranks, total


def _kept_awake(ctx: Rank) -> dict[str, Any]:
    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch as rpg
    from tests.support import keep_awake  # noqa: F401 - registers the way and its mode

    rpg.set_reload_mode("keep-awake")
    dist = ctx.begin()
    pair = dist.new_group([0, 1])
    mine = [dist.new_group([0]), dist.new_group([1])][ctx.rank]  # a non-member of the other
    created = []
    helper = c10d._new_process_group_helper

    def counting(*args: Any, **kwargs: Any) -> Any:
        created.append(kwargs.get("group_name") or args[3])
        return helper(*args, **kwargs)

    c10d._new_process_group_helper = counting
    out: dict[str, Any] = {"type": type(pair).__name__, "before": total(pair, ctx.rank + 1)}
    ids = (id(pair), id(mine))
    for cycle in range(2):
        rpg.destroy_process_groups()
        out[f"asleep {cycle}"] = [total(pair, 1.0), total(mine, 5.0)]
        rpg.reload_process_groups()
        out[f"awake {cycle}"] = total(pair, ctx.rank + 1)
    report = rpg.last_cycle_report()
    out["kept"] = sorted(report.destroy.groups.get("kept awake", []))
    out["names"] = sorted([str(pair.group_name), str(mine.group_name)])
    out["same objects"] = ids == (id(pair), id(mine))
    out["created"] = created
    out["listed"] = len(rpg.reloadable_groups())
    return out


def test_a_way_added_in_one_module_takes_part_in_every_cycle() -> None:
    for report in run_ranks(_kept_awake, 2, env=GATE):
        assert report["type"] == "ProcessGroup"  # torch's own object, no wrapper
        assert report["before"] == 3.0
        for cycle in range(2):
            assert report[f"asleep {cycle}"] == [2.0, 5.0]  # usable while the others sleep
            assert report[f"awake {cycle}"] == 3.0
        assert report["kept"] == report["names"]
        assert report["same objects"]
        assert report["created"] == []  # nobody, member or not, created anything for them
        assert report["listed"] == 2
