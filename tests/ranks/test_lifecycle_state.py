"""State given to a group after its creation comes back with every reload.

``set_timeout`` (the c10d function and the method) and hooks registered with
``register_pre_hook``/``register_post_hook`` live on the native group, which a reload replaces.
The oracle is torch: the timeout its backend reports, and the calls its hooks receive.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.support.ranks import Rank, run_ranks

pytestmark = pytest.mark.timeout(240)

needs_hooks = pytest.mark.skipif(
    not hasattr(__import__("torch.distributed").distributed.ProcessGroup, "register_pre_hook"),
    reason="this torch has no ProcessGroup hooks nor set_timeout (2.14+)",
)


def _set_later(ctx: Rank) -> dict:
    """A timeout given after creation with the API of every torch (2.13: ``_set_pg_timeout``)."""
    import torch
    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch as rpg

    ctx.init()
    rpg.set_wrap_policy("all")
    group = c10d.new_group([0, 1])
    setter = getattr(c10d, "set_timeout", None) or c10d._set_pg_timeout
    setter(timedelta(seconds=9), group)

    def timeout() -> float:
        return group.group._get_backend(torch.device("cpu")).options._timeout.total_seconds()

    out = [timeout()]
    for _ in range(2):
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        out.append(timeout())
    return {"timeouts": out}


def test_a_timeout_set_after_creation_comes_back_on_every_torch() -> None:
    """The timeout half of the replay applies on torch 2.13 too (``_set_pg_timeout``)."""
    for report in run_ranks(_set_later, 2, env={"SLIME_RELOADABLE_PG": "1"}):
        assert report["timeouts"] == [9.0, 9.0, 9.0]


def _replayed(ctx: Rank) -> dict:
    import torch
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    ctx.init()
    rpg.set_wrap_policy("all")
    by_function = dist.new_group([0, 1])
    by_method = dist.new_group([0, 1])
    hooked = dist.new_group([0, 1])
    dist.set_timeout(timedelta(seconds=5), group=by_function)
    by_method.set_timeout(timedelta(seconds=7))
    calls: list[str] = []
    hooked.register_pre_hook(1, lambda args: calls.append("pre"))
    hooked.register_post_hook(2, lambda args: calls.append("post"))
    hooked.register_pre_hook(3, lambda args: calls.append("dropped"))
    hooked.unregister_pre_hook(3)

    def timeouts() -> list[float]:
        cpu = torch.device("cpu")
        return [
            g.group._get_backend(cpu).options._timeout.total_seconds()
            for g in (by_function, by_method)
        ]

    out = {"before": timeouts()}
    for cycle in range(2):
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        calls.clear()
        dist.all_reduce(torch.ones(1), group=hooked)
        out[f"cycle {cycle}"] = {"timeouts": timeouts(), "hooks": sorted(set(calls))}
    return out


@needs_hooks
def test_set_timeout_and_hooks_apply_to_the_reloaded_group() -> None:
    for report in run_ranks(_replayed, 2, env={"SLIME_RELOADABLE_PG": "1"}):
        assert report["before"] == [5.0, 7.0]
        for cycle in ("cycle 0", "cycle 1"):
            assert report[cycle]["timeouts"] == [5.0, 7.0]
            assert report[cycle]["hooks"] == ["post", "pre"]  # and not the unregistered one
