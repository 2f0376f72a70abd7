"""Memory pools registered on a reloadable group's backend survive every reload (issue 17).

Megatron's NCCL allocator registers its pools with ``group._get_backend(device)
.register_mem_pool(pool, symm=True)``; the registration lives in the communicator, so a destroy
loses it. Only NCCL has ``register_mem_pool``, and NCCL cannot run on CPU: this is the one
place where the test gives gloo's real backend class a stand-in ``register_mem_pool`` and
``deregister_mem_pool`` (set on ``ProcessGroupGloo`` before any group exists), which only log
their calls. Everything else is real: two gate-activated ranks, real gloo groups, real
destroy and reload. The oracle is the stand-in's own log of which backend object it was
called on, against the backend torch hands out for the group after each reload.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.ranks import GATE, Rank, run_ranks

pytestmark = pytest.mark.timeout(180)


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


def test_a_registered_memory_pool_is_registered_again_after_every_reload() -> None:
    """Each destroy deregisters the pool from the backend it frees, each reload registers it
    on the new backend with the same arguments, exactly once even when the framework's own
    hook registers it too, and a pool the program deregistered stays deregistered."""
    for rank, result in enumerate(run_ranks(_pools_across_cycles, 2, env=GATE, timeout=150)):
        assert not result["problems"], f"rank {rank}: " + "; ".join(result["problems"])
        assert result["hook_calls"] == [1, 1, 1, 1], result["hook_calls"]
