"""What a group comes back with after each reload.

State given after its creation: ``set_timeout`` (the c10d function and the method; torch 2.13's
``_set_pg_timeout``) and hooks registered with ``register_pre_hook``/``register_post_hook``,
which live on the native group that a reload replaces; memory pools registered on its backend;
its timeout, ``group_desc`` and backend; and WORLD, registered without a timeout, the timeout of
its ``init_process_group``.

The oracle is torch: the timeout its backend reports, the calls its hooks receive, the backend
it hands out. Only NCCL has ``register_mem_pool``, and NCCL cannot run on CPU: the pool test
gives gloo's real backend class a stand-in ``register_mem_pool`` and ``deregister_mem_pool``
(set before any group exists) that only log their calls.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.support import gated
from tests.support.ranks import GATE, Rank, run_ranks

pytestmark = pytest.mark.timeout(240)

needs_hooks = pytest.mark.skipif(
    not hasattr(__import__("torch.distributed").distributed.ProcessGroup, "register_pre_hook"),
    reason="this torch has no ProcessGroup hooks nor set_timeout (2.14+)",
)


# ---- state set after creation: timeouts and hooks ------------------------------------------------


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


# ---- memory pools registered on a group's backend ------------------------------------------------


def _pools_across_cycles(ctx: Rank) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import reloadpg_autopatch as rpg

    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    calls: list[tuple[str, Any, Any, dict]] = []

    def register_mem_pool(self: Any, pool: Any, symm: bool = False) -> None:
        calls.append(("register", self, pool, {"symm": symm}))

    def deregister_mem_pool(self: Any, pool: Any) -> None:
        calls.append(("deregister", self, pool, {}))

    dist.ProcessGroupGloo.register_mem_pool = register_mem_pool
    dist.ProcessGroupGloo.deregister_mem_pool = deregister_mem_pool
    rpg.set_wrap_policy("all")
    ctx.init()
    cpu = torch.device("cpu")
    group = dist.new_group([0, 1])
    pool, other = object(), object()
    group._get_backend(cpu).register_mem_pool(pool, symm=True)
    group._get_backend(cpu).register_mem_pool(other)
    group._get_backend(cpu).deregister_mem_pool(other)  # forgotten: never registered again
    hook_calls = []

    def restore(groups: list) -> None:  # a framework restoring it itself, as the README shows
        hook_calls.append(len(groups))
        group._get_backend(cpu).register_mem_pool(pool, symm=True)

    rpg.add_reload_hook(after_reload=restore, name="restore")
    problems = []
    for cycle in range(1, 4):
        old = group._get_backend(cpu)
        del calls[:]
        rpg.destroy_process_groups()
        if [(c[0], c[1] is old, c[2] is pool) for c in calls] != [("deregister", True, True)]:
            problems.append(f"cycle {cycle} destroy: {[(c[0], c[2] is pool) for c in calls]}")
        del calls[:]
        rpg.reload_process_groups()
        new = group._get_backend(cpu)
        seen = [(c[0], c[1] is new, c[2] is pool, c[3]) for c in calls]
        if new is old or seen != [("register", True, True, {"symm": True})]:
            problems.append(f"cycle {cycle} reload: {seen} (new backend: {new is not old})")
        t = torch.tensor([1.0])
        dist.all_reduce(t, group=group)
        if t.item() != 2.0:
            problems.append(f"cycle {cycle}: all_reduce gave {t.item()}")
    # The program deregisters it: no later reload registers it again.
    group._get_backend(cpu).deregister_mem_pool(pool)
    rpg.destroy_process_groups()
    del calls[:]
    rpg.reload_process_groups()
    registered = [c for c in calls if c[0] == "register" and c[2] is pool]
    if len(registered) != 1:  # the hook's own call only
        problems.append(f"after deregistering: {len(registered)} registrations, want 1")
    return {"problems": problems, "hook_calls": hook_calls}


@pytest.mark.timeout(180)
def test_a_registered_memory_pool_is_registered_again_after_every_reload() -> None:
    """Each destroy deregisters the pool from the backend it frees, each reload registers it
    on the new backend with the same arguments, exactly once even when the framework's own
    hook registers it too, and a pool the program deregistered stays deregistered."""
    for rank, result in enumerate(run_ranks(_pools_across_cycles, 2, env=GATE, timeout=150)):
        assert not result["problems"], f"rank {rank}: " + "; ".join(result["problems"])
        assert result["hook_calls"] == [1, 1, 1, 1], result["hook_calls"]


# ---- what the group was created with -------------------------------------------------------------


def _state(ctx: Rank) -> list[dict[str, Any]]:
    from datetime import timedelta

    import torch
    from torch.distributed import distributed_c10d as c10d

    dist, active = gated.start(ctx, timeout=77 * 60)  # init_process_group(timeout=77 minutes)
    gated.world_in_cycle(active)  # registered without a timeout, as the README says
    group = dist.new_group([0, 1], timeout=timedelta(seconds=77), group_desc="x")
    cpu_only = dist.new_group([0, 1], backend="cpu:gloo")
    gated.reloadable(active, group, cpu_only)
    cpu = torch.device("cpu")
    reports = []
    for stage in gated.stages(active):
        native = gated.unwrap(group) if active else group
        world = c10d._get_default_group()
        reports.append(
            {
                "stage": stage,
                "world timeout": world._get_backend(cpu).options._timeout,
                "group timeout": native._get_backend(cpu).options._timeout,
                "group_desc": native.group_desc,
                "backend config": str(
                    c10d._world.pg_backend_config[gated.unwrap(cpu_only) if active else cpu_only]
                ),
            }
        )
        t = torch.ones(1)
        dist.all_reduce(t, group=group)
        assert t.item() == 2.0, stage
    return reports


@pytest.mark.timeout(600)
@gated.GATES
def test_reload_replays_timeout_description_and_backend(env) -> None:
    """A group comes back with everything it was created with: its timeout (torch keeps it in
    the backend's options), ``group_desc`` and backend; WORLD registered without a timeout
    comes back with the 77 minutes of its ``init_process_group``, not torch's default."""
    from datetime import timedelta

    for reports in run_ranks(_state, 2, env=env, timeout=gated.RANK_TIMEOUT):
        assert len(reports) == gated.CYCLES + 1
        for report in reports:
            assert report["world timeout"] == timedelta(minutes=77), report
            assert report["group timeout"] == timedelta(seconds=77), report
            assert report["group_desc"] == "x", report
            assert report["backend config"] == "cpu:gloo", report
