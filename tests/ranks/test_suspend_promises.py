"""Promises of ``docs/suspend.md`` that no other test defended (found by a mutation pass).

Each test here failed with one small bug planted in the package and passes without it:

- the reload's memory preflight empties the cache when short, and only then refuses;
- on torch 2.13 a sleeping group behind its wrapper still answers the local calls, and its
  refusal names the operation;
- the environment and NCCL versions that make suspend free nothing or refuse are refused;
- the doctor warns about a WORLD without ``device_id``, NVLS and ``NCCL_CUMEM_ENABLE=0``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.support import suspend_ranks
from tests.support.ranks import Rank

pytestmark = pytest.mark.timeout(300)

# ---- the preflight empties the cache before it refuses ("collecting garbage and emptying
# the allocator's cache when short") ------------------------------------------------------------


def _cleared_then_resumed(ctx: Rank) -> dict[str, Any]:
    """Every rank is short of what its resume needs until the cache is emptied: the probe's
    ``clear`` gives the memory back, so the reload resumes without a ``MemoryShortError``."""
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx)
    group = dist.new_group([0, 1], backend=leg, group_desc="tp")
    cleared: list[str] = []

    def clear(device: Any) -> None:
        cleared.append(str(device))
        s.occupy(None)  # what emptying the allocator's cache gives back

    rpg.set_memory_probe(s.memory_probe, device_types=("cpu", s.ACCELERATOR), clear=clear)
    rpg.destroy_process_groups()
    s.occupy(s.device_memory()[0])  # nothing free: short of the resume's need
    out: dict[str, Any] = {"free when short": s.device_memory()[0]}
    out["reload"] = suspend_ranks.outcome(rpg.reload_process_groups)
    out["cleared"] = cleared
    out["sum"] = suspend_ranks.outcome(lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, group))
    return out


def test_a_rank_short_of_memory_empties_the_cache_and_then_resumes() -> None:
    for rank, out in enumerate(suspend_ranks.run_once(_cleared_then_resumed)):
        assert out["free when short"] == 0, (rank, out)
        assert out["cleared"], f"rank {rank}: the preflight never emptied the cache: {out}"
        assert out["reload"] == ("ok", None), (rank, out["reload"])
        assert out["sum"] == ("ok", 3.0), (rank, out["sum"])


# ---- the local calls of a sleeping group ("still answers the local ones (rank(), size(),
# group_name)") ---------------------------------------------------------------------------------


def _local_calls(ctx: Rank) -> dict[str, Any]:
    leg = suspend_ranks.leg()
    torch, dist, rpg, _s = suspend_ranks.start(ctx)
    group = dist.new_group([0, 1], backend=leg, group_desc="tp")

    def local() -> dict[str, Any]:
        return {
            "rank": suspend_ranks.outcome(group.rank),
            "size": suspend_ranks.outcome(group.size),
            "group_name": suspend_ranks.outcome(lambda: str(group.group_name)),
        }

    awake = local()
    rpg.destroy_process_groups()
    asleep = local()
    refused = suspend_ranks.outcome(lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, group))
    rpg.reload_process_groups()
    return {"awake": awake, "asleep": asleep, "refused": refused}


def test_a_sleeping_group_still_answers_rank_size_and_its_name() -> None:
    for rank, out in enumerate(suspend_ranks.run_once(_local_calls)):
        assert out["awake"]["rank"] == ("ok", rank), out
        assert out["awake"]["size"] == ("ok", 2), out
        assert out["asleep"] == out["awake"], (rank, out)
        kind, text = out["refused"]
        assert kind == "GroupSuspendedError", (rank, out)
        # It names the group, the operation and what to call.
        assert "'tp'" in text, text
        assert "is suspended (" in text, text  # "(<the operation>)"
        # The pre-hook names torch's op (ALLREDUCE); on 2.13 the wrapper names the function.
        assert "allreduce" in text.lower().replace("_", ""), text
        assert "reload_process_groups()" in text, text


# ---- what makes suspend free nothing or refuse ("the mode treats that setting as 'cannot
# suspend'"; "NCCL 2.29.7 or later") ------------------------------------------------------------


def test_the_environment_that_makes_suspend_free_nothing_is_a_refusal() -> None:
    from reloadpg_autopatch.groups.ways import suspend as suspended

    assert suspended.environment_refusal({}) is None
    assert suspended.environment_refusal({"NCCL_CUMEM_ENABLE": "1"}) is None
    refusal = suspended.environment_refusal({"NCCL_CUMEM_ENABLE": "0"})
    assert refusal is not None
    assert "NCCL_CUMEM_ENABLE=0" in refusal


def _nccl_backend(version: tuple[int, ...]) -> Any:
    class FakeNCCLBackend:
        @staticmethod
        def get_build_nccl_version() -> tuple[int, ...]:
            return version

        @staticmethod
        def get_runtime_nccl_version() -> tuple[int, ...]:
            return version

    return FakeNCCLBackend()


@pytest.mark.parametrize(
    ("version", "refused"),
    [((2, 29, 6), True), ((2, 29, 0), True), ((2, 29, 7), False), ((2, 30, 3), False)],
)
def test_nccl_older_than_2_29_7_is_refused(version: tuple[int, ...], refused: bool) -> None:
    from reloadpg_autopatch.groups.ways import suspend as suspended

    refusal = suspended.version_refusal(_nccl_backend(version))
    assert (refusal is not None) is refused, (version, refusal)
    if refused:
        assert "2.29.7" in refusal, refusal


# ---- the doctor's warnings ("a WORLD without device_id", "NVLS buffers left resident", "an
# environment that makes suspend free nothing") --------------------------------------------------


def _doctor_suspend(monkeypatch: pytest.MonkeyPatch, world: Any) -> dict[str, Any]:
    import torch.distributed as dist

    from reloadpg_autopatch.groups import lifecycle, mode, ways
    from reloadpg_autopatch.tools.doctor import Report, gather

    monkeypatch.setattr(mode, "get_reload_mode", lambda: "suspend")
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "GroupMember", SimpleNamespace(WORLD=world))
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(lifecycle, "reloadable_groups", list)
    monkeypatch.setattr(ways, "explain", lambda *args: ("suspend in place", None))
    report = Report()
    gather.ways(report)
    return report.fidelity["suspend"]


def test_the_doctor_warns_about_what_makes_suspend_free_less(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch.distributed as dist

    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "0")
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    found = _doctor_suspend(monkeypatch, SimpleNamespace(bound_device_id=None))
    warnings = found["warnings"]
    assert any("NCCL_CUMEM_ENABLE=0" in w for w in warnings), warnings
    assert any(w.startswith("WORLD has no device_id") for w in warnings), warnings
    assert any(w.startswith("NVLS buffers stay resident") for w in warnings), warnings
    hooks = hasattr(dist.ProcessGroup, "register_pre_hook")
    assert found["guard"] == ("pre-hook" if hooks else "wrapper"), found

    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "1")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    found = _doctor_suspend(monkeypatch, SimpleNamespace(bound_device_id="cuda:0"))
    assert found["warnings"] == [], found["warnings"]


# ---- the order of the suspends and resumes ("in creation order (WORLD first)", the same on
# every rank: each is collective inside NCCL) ----------------------------------------------------


def _order(ctx: Rank) -> dict[str, Any]:
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx, world=leg, register=True)
    groups = [dist.group.WORLD] + [
        dist.new_group([0, 1], backend=leg, group_desc=d) for d in ("tp", "dp", "pp")
    ]
    labels = [suspend_ranks.backend(g).label for g in groups]
    seen = len(s.CALLS)
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    calls = [(c.backend, c.op) for c in s.CALLS[seen:] if c.op in ("suspend", "resume")]
    report = rpg.last_cycle_report().to_dict()
    return {
        "labels": labels,
        "names": [str(g.group_name) for g in groups],
        "suspended": report["destroy"]["groups"].get("suspended"),
        "resumed": report["reload"]["groups"].get("resumed"),
        "suspends": [b for b, op in calls if op == "suspend"],
        "resumes": [b for b, op in calls if op == "resume"],
        "sums": [suspend_ranks.rank_sum(dist, torch, ctx.rank, g) for g in groups],
    }


def test_suspends_and_resumes_run_in_creation_order_world_first() -> None:
    for rank, out in enumerate(suspend_ranks.run_once(_order)):
        assert out["suspends"] == out["labels"], (rank, out)
        assert out["resumes"] == out["labels"], (rank, out)
        # The report lists them alike: suspended at the destroy, resumed at the reload.
        assert out["suspended"] == out["resumed"] == out["names"], (rank, out)
        assert out["sums"] == [3.0] * 4, (rank, out["sums"])


# ---- the destroy step's report ("lists the groups suspended, guarded and resident (with the
# reason)") --------------------------------------------------------------------------------------


def _resident(ctx: Rank) -> dict[str, Any]:
    """Rank 1 releases ``h`` before the destroy: on rank 0 it stays resident, and the
    destroy's report says so, with the reason."""
    leg = suspend_ranks.leg()
    torch, dist, rpg, _s = suspend_ranks.start(ctx)
    g = dist.new_group([0, 1], backend=leg, group_desc="kept")
    h = dist.new_group([0, 1], backend=leg, group_desc="released")
    names = {"g": str(g.group_name), "h": str(h.group_name)}
    if ctx.rank == 1:
        dist.destroy_process_group(h)
    rpg.destroy_process_groups()
    groups = rpg.last_cycle_report().to_dict()["destroy"]["groups"]
    rpg.reload_process_groups()
    return {"names": names, "groups": groups, "g": suspend_ranks.rank_sum(dist, torch, ctx.rank, g)}


def test_the_destroy_report_lists_a_resident_group_with_its_reason() -> None:
    out = suspend_ranks.run_once(_resident)[0]
    assert out["groups"].get("suspended") == [out["names"]["g"]], out
    assert out["groups"].get("resident") == [f"{out['names']['h']} (resident)"], out
    assert out["g"] == 3.0, out


# ---- torch 2.14: no wrapper at all ("in suspend mode on 2.14 no collective is wrapped";
# "dist.group.WORLD is torch's own object for the whole run") -----------------------------------


def _types(ctx: Rank) -> dict[str, Any]:
    leg = suspend_ranks.leg()
    torch, dist, rpg, _s = suspend_ranks.start(ctx, world=leg, register=True)
    groups = {
        "WORLD": dist.group.WORLD,
        "tp": dist.new_group([0, 1], backend=leg, group_desc="tp"),
    }

    def kinds() -> dict[str, str]:
        return {
            **{name: type(g).__name__ for name, g in groups.items()},
            "dist.group.WORLD": type(dist.group.WORLD).__name__,
        }

    out = {"awake": kinds()}
    rpg.destroy_process_groups()
    out["asleep"] = kinds()
    rpg.reload_process_groups()
    out["after"] = kinds()
    out["sums"] = [suspend_ranks.rank_sum(dist, torch, ctx.rank, g) for g in groups.values()]
    return out


@suspend_ranks.needs_b
def test_on_torch_2_14_every_group_stays_torch_own_object() -> None:
    for rank, out in enumerate(suspend_ranks.run_once(_types)):
        for when in ("awake", "asleep", "after"):
            assert set(out[when].values()) == {"ProcessGroup"}, (rank, when, out[when])
        assert out["sums"] == [3.0, 3.0], (rank, out["sums"])
