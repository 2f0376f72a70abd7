"""``auto`` mode: the way that gives back the most for the least, group by group.

Suspend keeps what it cannot free: a one-rank NCCL communicator allocates a 512 MiB network
buffer that a suspend keeps, as it keeps inter-node network buffers. So in ``auto`` mode a
one-rank group is freed at every destroy (behind its wrapper, or in place where torch can) and
made again at the reload, and a group whose ``memory_stats()`` says a suspend would free less
than ``SLIME_RELOADABLE_PG_SUSPEND_MIN_FREED`` of its memory is freed instead of suspended;
``suspend`` mode stays strict. With a registered WORLD that swaps, ``auto`` never suspends a
group the swap would tear down; a group that falls back is created again with its non-members
taking part; and the refusal of a destroyed group names the call the program made.

No GPU exists here, so the groups run on the stand-in of ``reloadpg_autopatch/tools/cpu_nccl``
(NCCL's suspend protocol on gloo), whose memory figures a test sets. The oracles are outside the
package: the stand-in's call log (which backend was asked to suspend), its count of backends
created (a group freed behind its wrapper is made again), torch's results, and the refusal a use
while asleep raises.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from reloadpg_autopatch.tools import cpu_nccl as suspendable
from tests.support import accelerator
from tests.support.ranks import GATE, Rank, run_ranks

pytestmark = pytest.mark.timeout(240)

ON_214 = suspendable.python_backend_available()
KiB, MiB = 2**10, 2**20


def _start(ctx: Rank, mode: str) -> tuple[Any, Any, Any, Any]:
    """Join WORLD (gloo) in ``mode`` and register it, as slime's actor does: from then on every
    group is reloadable, the one-rank groups Megatron makes for each dimension of size 1 too
    (a gloo WORLD itself stays awake in ``auto`` and ``suspend`` modes)."""
    import warnings

    import torch
    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.tools import cpu_nccl as s

    warnings.simplefilter("ignore", FutureWarning)
    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    s.register()
    rpg.set_reload_mode(mode)
    rpg.set_memory_probe(s.memory_probe, device_types=("cpu", s.ACCELERATOR))
    rpg.set_memory_guard(0.0)
    ctx.init(timeout=30.0)
    rpg.register_default_process_group()
    return torch, dist, rpg, s


def _use(dist: Any, torch: Any, group: Any) -> tuple[str, Any]:
    try:
        t = torch.tensor([1.0])
        dist.all_reduce(t, group=group)
        return ("ok", t.item())
    except RuntimeError as error:
        return (type(error).__name__, str(error)[:200])


# ---- groups a suspend would keep most of are freed -----------------------------------------------


def _one_rank(ctx: Rank) -> dict[str, Any]:
    """Each rank's one-rank group and a pair, both on the stand-in, two cycles in auto mode;
    every ``ProcessGroup.shutdown`` (how torch frees a communicator, in place or not) counted."""
    torch, dist, rpg, s = _start(ctx, "auto")
    solo = [dist.new_group([r], backend=s.NAME_A) for r in range(ctx.world_size)][ctx.rank]
    pair = dist.new_group([0, 1], backend=s.NAME_A)
    for group in (solo, pair):
        dist.barrier(group=group)  # communicators exist: a suspend would free something
    backend = {"solo": id(s.BACKENDS[-2]), "pair": id(s.BACKENDS[-1])}
    solo_name = str(solo.group_name)
    shut: list[str] = []
    shutdown = dist.ProcessGroup.shutdown

    def spy(self: Any) -> Any:
        shut.append(str(self.group_name))
        return shutdown(self)

    dist.ProcessGroup.shutdown = spy
    out: dict[str, Any] = {"asleep": [], "after": [], "made": [], "shut": []}
    for _ in range(2):
        made = s.creations()
        shut.clear()
        rpg.destroy_process_groups()
        out["shut"].append(shut.count(solo_name))
        out["asleep"].append(
            {"solo": _use(dist, torch, solo)[0], "pair": _use(dist, torch, pair)[0]}
        )
        rpg.reload_process_groups()
        out["after"].append({"solo": _use(dist, torch, solo), "pair": _use(dist, torch, pair)})
        out["made"].append(s.creations() - made)
    asked = {id(b): b for b in s.BACKENDS}
    out["suspended"] = sorted(
        name
        for name, ident in backend.items()
        if any(c.op == "suspend" and c.backend == asked[ident].label for c in s.CALLS)
    )
    out["type"] = type(solo).__name__
    return out


def test_a_one_rank_group_is_freed_not_suspended_in_auto_mode() -> None:
    """A one-rank group's communicator is never asked to suspend: each destroy frees it (torch
    shuts it down), each reload makes it again and it works right after; the pair beside it is
    suspended as before. torch 2.13: behind its wrapper (one new backend a cycle; a use while
    asleep is refused as destroyed). torch 2.14: torch's own object, rebuilt in place (no new
    backend; on gloo a group shut down in place still runs, docs/limitations.md)."""
    for rank, out in enumerate(run_ranks(_one_rank, 2, timeout=120, env=GATE)):
        assert out["suspended"] == ["pair"], (rank, out["suspended"])
        assert out["shut"] == [1, 1], (rank, out["shut"])
        assert out["after"] == [{"solo": ("ok", 1.0), "pair": ("ok", 2.0)}] * 2, (rank, out)
        assert [a["pair"] for a in out["asleep"]] == ["GroupSuspendedError"] * 2, out["asleep"]
        if ON_214:
            assert (out["type"], out["made"]) == ("ProcessGroup", [0, 0]), (rank, out)
        else:
            assert (out["type"], out["made"]) == ("ReloadableProcessGroup", [1, 1]), (rank, out)
            assert [a["solo"] for a in out["asleep"]] == ["GroupDestroyedError"] * 2, out


def _little(ctx: Rank, mode: str) -> dict[str, Any]:
    """Two pairs on the stand-in: ``net`` keeps most of its memory asleep (64 KiB of 1 MiB
    freed by a suspend), ``p2p`` frees most (1 MiB of 1.25 MiB)."""
    torch, dist, rpg, s = _start(ctx, mode)
    s.configure(suspend_bytes=64 * KiB, persist_bytes=1 * MiB)
    net = dist.new_group([0, 1], backend=s.NAME_A, group_desc="net")
    s.configure()
    p2p = dist.new_group([0, 1], backend=s.NAME_A, group_desc="p2p")
    labels = {id(s.BACKENDS[-2]): "net", id(s.BACKENDS[-1]): "p2p"}
    for group in (net, p2p):
        dist.barrier(group=group)
    out: dict[str, Any] = {}
    out["destroy"] = _use(dist, torch, net)[0]
    rpg.destroy_process_groups()
    out["asleep"] = {"net": _use(dist, torch, net)[0], "p2p": _use(dist, torch, p2p)[0]}
    out["report"] = rpg.last_cycle_report().to_dict()["destroy"]["groups"]
    rpg.reload_process_groups()
    out["after"] = {"net": _use(dist, torch, net), "p2p": _use(dist, torch, p2p)}
    by_label = {b.label: labels.get(id(b)) for b in s.BACKENDS}
    out["suspended"] = sorted(
        {by_label[c.backend] for c in s.CALLS if c.op == "suspend" and by_label.get(c.backend)}
    )
    out["net name"] = str(net.group_name)
    return out


def _little_auto(ctx: Rank) -> dict[str, Any]:
    return _little(ctx, "auto")


def _little_suspend(ctx: Rank) -> dict[str, Any]:
    return _little(ctx, "suspend")


def test_a_group_whose_suspend_frees_little_is_freed_in_auto_mode() -> None:
    """``net`` would keep 94% of its memory asleep: auto mode frees it (behind its wrapper on
    torch 2.13, in place on 2.14), never asks it to suspend, names it in the report with the
    share a suspend would free, and it works after the reload; ``p2p`` is suspended."""
    for rank, out in enumerate(run_ranks(_little_auto, 2, timeout=120, env=GATE)):
        assert out["suspended"] == ["p2p"], (rank, out["suspended"])
        assert out["asleep"] == {"net": "GroupDestroyedError", "p2p": "GroupSuspendedError"}, out
        assert out["after"] == {"net": ("ok", 2.0), "p2p": ("ok", 2.0)}, (rank, out["after"])
        freed = out["report"].get("freed, not suspended", [])
        assert len(freed) == 1, (rank, out["report"])
        assert freed[0].startswith(out["net name"]), freed
        assert "6%" in freed[0], freed  # 64 KiB of 1.0625 MiB


def test_suspend_mode_stays_strict_and_suspends_a_group_that_frees_little() -> None:
    """In ``suspend`` mode the same group is suspended like any other: the mode allows one way."""
    for rank, out in enumerate(run_ranks(_little_suspend, 2, timeout=120, env=GATE)):
        assert out["suspended"] == ["net", "p2p"], (rank, out["suspended"])
        assert out["asleep"] == {"net": "GroupSuspendedError", "p2p": "GroupSuspendedError"}
        assert out["after"] == {"net": ("ok", 2.0), "p2p": ("ok", 2.0)}, (rank, out["after"])


def _shares(ctx: Rank) -> list[str]:
    """Three pairs whose suspend would free 6%, 40% and 80% of their memory (64 KiB of
    1.0625 MiB, 400 KiB of 1000 KiB, 1 MiB of 1.25 MiB): which the auto mode suspends."""
    torch, dist, rpg, s = _start(ctx, "auto")
    labels, groups = {}, []  # the program holds its groups: one dropped is forgotten
    for label, sizes in (
        ("net", {"suspend_bytes": 64 * KiB, "persist_bytes": 1 * MiB}),
        ("mid", {"suspend_bytes": 400 * KiB, "persist_bytes": 600 * KiB}),
        ("p2p", {}),
    ):
        s.configure(**sizes)
        groups.append(dist.new_group([0, 1], backend=s.NAME_A, group_desc=label))
        labels[id(s.BACKENDS[-1])] = label
        dist.barrier(group=groups[-1])
    s.configure()
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    assert [_use(dist, torch, group) for group in groups] == [("ok", 2.0)] * 3
    by_label = {b.label: labels.get(id(b)) for b in s.BACKENDS}
    return sorted(
        {by_label[c.backend] for c in s.CALLS if c.op == "suspend" and by_label.get(c.backend)}
    )


@pytest.mark.parametrize(
    ("share", "suspended"),
    [(None, ["p2p"]), ("0.9", []), ("0", ["mid", "net", "p2p"])],
)
def test_auto_suspends_what_frees_at_least_the_min_freed_share_half_by_default(
    share: str | None, suspended: list[str]
) -> None:
    """``SLIME_RELOADABLE_PG_SUSPEND_MIN_FREED`` decides, from the environment: unset, half
    (40% is freed instead, 80% suspended); ``0.9``, nothing here is suspended; ``0``, every
    group is, whatever a suspend frees."""
    env = dict(GATE) if share is None else {**GATE, "SLIME_RELOADABLE_PG_SUSPEND_MIN_FREED": share}
    for rank, out in enumerate(run_ranks(_shares, 2, timeout=120, env=env)):
        assert out == suspended, (rank, share, out)


# ---- auto with a WORLD that swaps; a fallback group and its non-members --------------------------


#: On torch 2.14 a WORLD that swaps in auto mode: one that can neither suspend nor reconfigure
#: in place (gloo reconfigures): the Python stand-in, for an accelerator only, unsupported.
ACCEL_PY = "suspendable_acc_py"


def _auto_with_a_swapping_world(ctx: Rank) -> dict[str, Any]:
    if accelerator.ON_214:
        from reloadpg_autopatch.tools import cpu_nccl as s

        s.register()
        import torch.distributed as dist

        dist.Backend.register_backend(ACCEL_PY, s.create_b, devices=[s.ACCELERATOR])
        s.configure(unsupported="backend")
        torch, dist, rpg, s = accelerator.start(ctx, "auto", world=ACCEL_PY)
        s.configure()
        rpg.register_default_process_group(timedelta(seconds=30))
    else:  # 2.13 reconfigures nothing: a gloo WORLD named as an accelerator swaps
        torch, dist, rpg, s = accelerator.start(ctx, "auto")
        rpg.register_default_process_group(timedelta(seconds=30), accelerator_backends=("gloo",))
    # WORLD swaps: every group torch knows is torn down at each cycle.
    group = dist.new_group([0, 1], backend=s.NAME_A, group_desc="standin")
    created = s.creations(s.NAME_A)
    out: dict[str, Any] = {"type": type(group).__name__}
    sums = []
    for _ in range(2):
        rpg.destroy_process_groups()
        peer = 1 - ctx.rank
        t = torch.zeros(1)
        op = dist.isend if ctx.rank == 0 else dist.irecv
        made_asleep = accelerator.outcome(
            lambda op=op, t=t, peer=peer: dist.P2POp(op, t, peer, group)
        )
        out.setdefault("p2p op", made_asleep)
        rpg.reload_process_groups()
        sums.append(accelerator.rank_sum(dist, torch, ctx.rank, group))
    # A P2POp made while awake, handed to batch_isend_irecv after a destroy.
    made = dist.P2POp(dist.isend if ctx.rank == 0 else dist.irecv, torch.zeros(1), peer, group)
    rpg.destroy_process_groups()
    out["batch"] = accelerator.outcome(lambda: dist.batch_isend_irecv([made]))
    rpg.reload_process_groups()
    out["sums"] = sums
    out["lifecycle calls"] = [c.op for c in s.CALLS if c.op in ("suspend", "resume")]
    out["created per cycle"] = (s.creations(s.NAME_A) - created) / 3
    return out


def test_auto_never_suspends_a_group_that_a_swapping_world_tears_down() -> None:
    """In ``auto`` with a registered WORLD that swaps, each cycle destroys every group torch
    knows: a suspendable group must not be suspended (it would be torn down asleep), but
    reload behind a wrapper, re-created once per cycle, and give torch's sums."""
    for rank, out in enumerate(accelerator.run_once(_auto_with_a_swapping_world)):
        assert out["type"] == "ReloadableProcessGroup", (rank, out["type"])
        assert out["lifecycle calls"] == [], (rank, out["lifecycle calls"])
        assert out["created per cycle"] == 1, (rank, out["created per cycle"])
        assert out["sums"] == [3.0, 3.0]


def test_a_destroyed_groups_refusal_names_the_call_the_program_made() -> None:
    """``P2POp(...)`` on a destroyed group names ``torch.distributed.P2POp()`` (not its
    ``__new__``), and ``batch_isend_irecv`` of a ``P2POp`` made before the destroy names
    ``torch.distributed.batch_isend_irecv()``."""
    import reloadpg_autopatch as rpg

    for out in accelerator.run_once(_auto_with_a_swapping_world):
        for key, call in (("p2p op", "P2POp"), ("batch", "batch_isend_irecv")):
            kind, text = out[key]
            assert kind is rpg.GroupDestroyedError, out[key]
            assert f"(torch.distributed.{call}())" in text, text
            assert "__new__" not in text, text


def _auto_fallback_with_a_non_member(ctx: Rank) -> dict[str, Any]:
    torch, dist, rpg, s = accelerator.start(ctx, "auto")
    pair = dist.new_group([0, 1], backend=s.NAME_A, group_desc="fallback-pair")
    if ctx.rank == 1:  # rank 1 cannot suspend it any more (nor the backends it makes again)
        pair._get_backend(torch.device("cpu")).settings.unsupported = "backend"
        s.configure(unsupported="backend")
    later = dist.new_group([0, 1, 2], group_desc="after")  # names stay aligned after it
    created = s.creations(s.NAME_A)
    sums = []
    for _ in range(2):
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        member = ctx.rank in (0, 1)
        sums.append(
            (
                accelerator.rank_sum(dist, torch, ctx.rank, pair) if member else None,
                accelerator.rank_sum(dist, torch, ctx.rank, later),
            )
        )
    return {
        "sums": sums,
        "created": s.creations(s.NAME_A) - created,
        "suspends": [c.op for c in s.CALLS if c.op == "suspend"],
        "lazy wrapper": accelerator.ON_214,
    }


def test_auto_fallback_group_is_recreated_with_its_non_members_taking_part() -> None:
    """``auto`` with three ranks: a group of ranks 0 and 1 whose members answer differently
    (rank 1's backend cannot suspend) falls back (on 2.13 destroyed behind its wrapper and
    created again, collectively: rank 2 takes part; on 2.14 kept resident). With
    ``TORCH_DIST_INIT_BARRIER=1`` every creation waits for every rank, members or not, so a
    non-member that did not take part would leave the members waiting. Nothing suspends, no
    rank hangs, and the group and one made after it give torch's sums every cycle."""
    runs = accelerator.run_once(_auto_fallback_with_a_non_member, 3, TORCH_DIST_INIT_BARRIER="1")
    for rank, out in enumerate(runs):
        pair = 3.0 if rank < 2 else None
        assert out["sums"] == [(pair, 6.0), (pair, 6.0)], (rank, out["sums"])
        assert out["suspends"] == [], (rank, out["suspends"])
        if not accelerator.ON_214:  # destroyed and created again at each of the two reloads
            assert out["created"] == (2 if rank < 2 else 0), (rank, out["created"])
