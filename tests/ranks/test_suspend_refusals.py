"""What suspend mode refuses, agreed on every rank, and what a refusal leaves.

A group one rank cannot suspend: strict mode refuses on every rank with nothing suspended,
``auto`` falls back for it and suspends the rest; a group one rank left awake at creation
sleeps on no rank; a group no member initialized is guarded without a suspend. What makes a
suspend free nothing or fail is refused (``NCCL_CUMEM_ENABLE=0``, ``NCCL_DISABLE_MEM_MANAGER``
set any way but ``0``, an NCCL older than 2.29.7, an accelerator group that cannot suspend, a
gloo WORLD named as accelerator), and the doctor warns of what makes it free less. After a
refusal the next destroy agrees and suspends; a sleeping group's refusal is a
``GroupDestroyedError``, the group stays listed, and a hook's error says the groups are
suspended.

No GPU here: the backend is the stand-in of ``reloadpg_autopatch/tools/cpu_nccl``, also
registered for an accelerator device type only (``tests/support/accelerator.py``), as NCCL is
for ``cuda``. The oracles are the stand-in's call log, torch's results and maps, the doctor's
output and the exception each call raises (checked with ``isinstance`` where the class is the
promise).
"""

from __future__ import annotations

import functools
import os
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support import accelerator, suspend_ranks
from tests.support.ranks import GATE, Rank, run_ranks, total

pytestmark = pytest.mark.timeout(300)

# ---- agreement: strict refusal, auto fallback, guard only, mixed answers ---------------------


def _refusal(ctx: Rank) -> dict[str, Any]:
    """Strict mode with ``tp`` that rank 1 cannot suspend (``SUSPEND_TEST_HOW``: ``live``: its
    backend stops answering after creation; ``creation``: it said so from the start, as
    ``SUSPENDABLE_UNSUPPORTED=backend@1`` makes it; ``mixed``: initialized on rank 0, not yet
    on rank 1), beside ``dp``, which can."""
    how = os.environ["SUSPEND_TEST_HOW"]
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx)
    if how == "mixed" and ctx.rank == 1:
        s.configure(uninitialized=True)
    if how == "creation" and ctx.rank == 1:  # SUSPENDABLE_UNSUPPORTED=backend@1, for tp only
        s.configure(unsupported="backend")
    tp = dist.new_group([0, 1], backend=leg, group_desc="tp")
    s.configure()
    dp = dist.new_group([0, 1], backend=leg, group_desc="dp")
    if how == "live" and ctx.rank == 1:
        suspend_ranks.backend(tp).settings.unsupported = "backend"
    out: dict[str, Any] = {"tp": str(tp.group_name), "dp": str(dp.group_name)}
    out["destroy"] = suspend_ranks.outcome(rpg.destroy_process_groups)
    out["log"] = suspend_ranks.calls(s)
    out["states"] = [b.state for b in s.backends()]
    out["usable"] = [
        suspend_ranks.outcome(lambda g=g: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))
        for g in (tp, dp)
    ]
    out["reload"] = suspend_ranks.outcome(rpg.reload_process_groups)
    return out


@pytest.mark.parametrize("how", ["live", "creation", "mixed"])
def test_strict_mode_refuses_on_every_rank_with_nothing_suspended(how: str) -> None:
    """``suspend`` mode, a group one rank cannot suspend (its backend stopped answering, or
    said at creation that it does not support suspend, or answers "not initialized" where the
    peer's is initialized): every rank raises ``ModeRefusedError`` with the same text naming
    that group, no suspend reaches any backend on any rank (the other group's neither), and
    every group stays awake and usable."""
    ranks = suspend_ranks.run_once(_refusal, SUSPEND_TEST_HOW=how)
    texts = set()
    for rank, out in enumerate(ranks):
        kind, text = out["destroy"]
        assert kind == "ModeRefusedError", (rank, kind, text)
        assert repr(out["tp"]) in text, text
        assert repr(out["dp"]) not in text, text
        texts.add(text)
        assert [c for c in out["log"] if c[1] in ("suspend", "resume")] == [], out["log"]
        assert set(out["states"]) == {"awake"}, out["states"]
        assert out["usable"] == [("ok", 3.0), ("ok", 3.0)], out["usable"]
        assert out["reload"] == ("ok", None), out["reload"]
    assert len(texts) == 1, texts
    if how == "mixed":
        assert "answered differently" in texts.pop()


def _fallback(ctx: Rank) -> dict[str, Any]:
    """Auto mode: ``tp`` rank 1 cannot suspend any more, ``mx`` answers differently per rank,
    ``dp`` can suspend everywhere."""
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx, mode="auto")
    tp = dist.new_group([0, 1], backend=leg, group_desc="tp")
    if ctx.rank == 1:
        s.configure(uninitialized=True)
    mx = dist.new_group([0, 1], backend=leg, group_desc="mx")
    s.configure()
    dp = dist.new_group([0, 1], backend=leg, group_desc="dp")
    if ctx.rank == 1:
        suspend_ranks.backend(tp).settings.unsupported = "backend"
    groups = {"tp": tp, "mx": mx, "dp": dp}
    ids = {name: id(g) for name, g in groups.items()}
    made = s.creations()
    out: dict[str, Any] = {"names": {n: str(g.group_name) for n, g in groups.items()}}
    out["types"] = {n: type(g).__name__ for n, g in groups.items()}
    out["destroy"] = suspend_ranks.outcome(rpg.destroy_process_groups)
    out["asleep"] = {
        n: suspend_ranks.outcome(lambda g=g: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))
        for n, g in groups.items()
    }
    out["log"] = suspend_ranks.calls(s)
    out["report"] = rpg.last_cycle_report().to_dict()["destroy"]["groups"]
    out["reload"] = suspend_ranks.outcome(rpg.reload_process_groups)
    out["after"] = {
        n: suspend_ranks.outcome(lambda g=g: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))
        for n, g in groups.items()
    }
    out["ids same"] = {n: id(g) == ids[n] for n, g in groups.items()}
    out["creations"] = s.creations() - made
    return out


def test_auto_mode_falls_back_for_the_groups_that_cannot_suspend_and_suspends_the_rest() -> None:
    """``auto`` mode: a group some rank cannot suspend, and one whose members answer
    differently, fall back alike on every rank (torch 2.14, the program holds torch's group:
    it stays resident and usable; torch 2.13, behind a wrapper: destroyed, refused as
    destroyed, and created again by the reload), with no suspend reaching their backends;
    the group that can suspend still does, on every rank."""
    for rank, out in enumerate(suspend_ranks.run_once(_fallback)):
        names = out["names"]
        assert out["destroy"] == ("ok", None), out["destroy"]
        kind, text = out["asleep"]["dp"]
        assert suspend_ranks.is_suspended_error(kind, text, "dp"), (rank, kind, text)
        suspends = [c for c in out["log"] if c[1] == "suspend"]
        assert [c[3] for c in suspends] == ["ok"], suspends  # dp's, and only it
        for name in ("tp", "mx"):
            if suspend_ranks.ON_214:
                assert out["types"][name] == "ProcessGroup"
                assert out["asleep"][name] == ("ok", 3.0), (rank, name)  # resident
                assert any(r.startswith(names[name]) for r in out["report"]["resident"])
            else:
                assert out["types"][name] == "ReloadableProcessGroup"
                assert out["asleep"][name][0] == "GroupDestroyedError", out["asleep"][name]
                assert names[name] in out["report"]["destroyed"]
        assert out["reload"] == ("ok", None), out["reload"]
        assert out["after"] == {"tp": ("ok", 3.0), "mx": ("ok", 3.0), "dp": ("ok", 3.0)}
        assert all(out["ids same"].values())
        assert out["creations"] == (0 if suspend_ranks.ON_214 else 2), out["creations"]


def _left_awake(ctx: Rank) -> dict[str, Any]:
    """Auto mode: rank 1's backend says at creation that it does not support suspend, so rank
    1 leaves ``cr`` torch's own and awake, where rank 0 takes it to suspend; ``dp`` can
    suspend everywhere. Two cycles."""
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(
        ctx, mode="auto", timeout=10.0
    )  # a lone creation: 10 s
    if ctx.rank == 1:
        s.configure(unsupported="backend")
    cr = dist.new_group([0, 1], backend=leg, group_desc="cr")
    s.configure()
    dp = dist.new_group([0, 1], backend=leg, group_desc="dp")
    made = s.creations()
    cr_label = suspend_ranks.backend(cr).label
    out: dict[str, Any] = {"cycles": []}
    for _ in range(2):
        seen = len(s.CALLS)
        destroy = suspend_ranks.outcome(rpg.destroy_process_groups)
        asleep = {
            n: suspend_ranks.outcome(lambda g=g: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))[
                0
            ]
            for n, g in (("cr", cr), ("dp", dp))
        }
        reload = suspend_ranks.outcome(rpg.reload_process_groups)
        cr_log = [c[1] for c in suspend_ranks.calls(s, seen) if c[0] == cr_label]
        after = [
            suspend_ranks.outcome(lambda g=g: suspend_ranks.rank_sum(dist, torch, ctx.rank, g))
            for g in (cr, dp)
        ]
        out["cycles"].append(
            {
                "destroy": destroy,
                "asleep": asleep,
                "reload": reload,
                "cr log": cr_log,
                "after": after,
            }
        )
    out["creations"] = s.creations() - made
    return out


def test_a_group_one_rank_left_awake_at_creation_sleeps_on_no_rank() -> None:
    """``auto`` mode, ``cr`` left awake on rank 1 from its creation (its backend there does
    not support suspend), taken to suspend on rank 0: no rank suspends, destroys or creates
    ``cr`` (rank 0 alone in a barrier or a creation would wait for a peer that never comes),
    it works while the others sleep and after, and ``dp`` still sleeps and wakes."""
    for rank, out in enumerate(suspend_ranks.run_once(_left_awake)):
        for number, cycle in enumerate(out["cycles"], start=1):
            where = (rank, number)
            assert cycle["destroy"] == ("ok", None), (where, cycle["destroy"])
            assert cycle["asleep"] == {"cr": "ok", "dp": "GroupSuspendedError"}, where
            assert cycle["reload"] == ("ok", None), (where, cycle["reload"])
            assert not {"suspend", "resume"} & set(cycle["cr log"]), (where, cycle["cr log"])
            assert cycle["after"] == [("ok", 3.0), ("ok", 3.0)], (where, cycle["after"])
        assert out["creations"] == 0, (rank, out["creations"])


def _guard_only(ctx: Rank) -> dict[str, Any]:
    leg = suspend_ranks.leg()
    torch, dist, rpg, s = suspend_ranks.start(ctx)
    tp = dist.new_group([0, 1], backend=leg, group_desc="tp")
    backend = suspend_ranks.backend(tp)
    out: dict[str, Any] = {"name": str(tp.group_name)}
    rpg.destroy_process_groups()
    out["report"] = rpg.last_cycle_report().to_dict()["destroy"]["groups"]
    out["asleep"] = suspend_ranks.outcome(lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, tp))
    out["initialized asleep"] = backend.initialized
    rpg.reload_process_groups()
    out["first cycle"] = suspend_ranks.calls(s)
    out["after"] = suspend_ranks.outcome(lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, tp))
    seen = len(s.CALLS)
    rpg.destroy_process_groups()  # variant B: the collective above created the communicator
    out["second asleep"] = suspend_ranks.outcome(
        lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, tp)
    )
    rpg.reload_process_groups()
    out["second cycle"] = suspend_ranks.calls(s, seen)
    out["second after"] = suspend_ranks.outcome(
        lambda: suspend_ranks.rank_sum(dist, torch, ctx.rank, tp)
    )
    out["lazy"] = leg == s.NAME_B  # B's first collective initializes, as NCCL's does
    return out


def test_a_group_no_member_initialized_is_guarded_without_a_suspend() -> None:
    """Every member's communicator says "not initialized" (NCCL's lazy init): the group is
    guarded (refused while asleep, reported as guarded) but no suspend or resume is called,
    and the refused call did not initialize it; once a collective has initialized it
    (variant B, like NCCL), the next cycle suspends and resumes it."""
    for rank, out in enumerate(suspend_ranks.run_once(_guard_only, SUSPENDABLE_UNINITIALIZED="1")):
        assert out["report"].get("guarded") == [out["name"]], out["report"]
        assert out["name"] not in out["report"].get("suspended", []), out["report"]
        kind, text = out["asleep"]
        assert suspend_ranks.is_suspended_error(kind, text, "tp"), (rank, kind, text)
        assert out["initialized asleep"] is False
        assert out["first cycle"] == [], out["first cycle"]
        assert out["after"] == ("ok", 3.0)
        assert out["second asleep"][0] == "GroupSuspendedError"
        calls = [(op, outcome) for _, op, _, outcome in out["second cycle"]]
        if out["lazy"]:
            assert calls == [("suspend", "ok"), ("resume", "ok")], calls
        else:
            assert calls == [], calls
        assert out["second after"] == ("ok", 3.0)


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


# ---- NCCL_DISABLE_MEM_MANAGER, whatever its spelling ---------------------------------------------


def _suspend_group_with(ctx: Rank, value: str) -> dict[str, Any]:
    """Suspend mode, ``NCCL_DISABLE_MEM_MANAGER=value`` on both ranks; one group over both on
    the accelerator stand-in."""
    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.tools import cpu_nccl as s

    os.environ["NCCL_DISABLE_MEM_MANAGER"] = value
    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    s.register()
    dist.Backend.register_backend(accelerator.ACCEL, accelerator.create, devices=[s.ACCELERATOR])
    rpg.set_reload_mode("suspend")
    rpg.set_memory_probe(s.memory_probe, device_types=("cpu", s.ACCELERATOR))
    rpg.set_memory_guard(0.0)
    ctx.init(timeout=10.0)
    try:
        group = dist.new_group([0, 1], backend=accelerator.MIXED)
    except Exception as error:
        return {"error": type(error).__name__, "message": str(error)}
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    return {"error": None, "sum": total(group, ctx.rank + 1)}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("value", ["1", "true", "yes", "2"])
def test_nccl_disable_mem_manager_set_any_way_is_refused_in_suspend_mode(value: str) -> None:
    """``NCCL_DISABLE_MEM_MANAGER`` set (``1``, ``true``, ``yes``, ``2``): suspend mode refuses
    the group at creation with ``ModeRefusedError`` naming the variable."""
    body = functools.partial(_suspend_group_with, value=value)
    for out in run_ranks(body, 2, timeout=60, env=GATE):
        assert out["error"] == "ModeRefusedError", out
        assert "NCCL_DISABLE_MEM_MANAGER" in out["message"], out


@pytest.mark.timeout(180)
def test_nccl_disable_mem_manager_0_suspends() -> None:
    """``NCCL_DISABLE_MEM_MANAGER=0`` leaves NCCL's memory manager on: the group suspends and
    wakes, and works."""
    reports = run_ranks(functools.partial(_suspend_group_with, value="0"), 2, timeout=60, env=GATE)
    assert reports == [{"error": None, "sum": 3.0}] * 2, reports


# ---- suspend mode: refusals, sleeping groups, errors by type ---------------------------------


def _suspend_mode(ctx: Rank) -> dict[str, Any]:
    torch, dist, rpg, s = accelerator.start(ctx, "suspend")
    out: dict[str, Any] = {}
    # A gloo WORLD named in accelerator_backends cannot suspend: refused, nothing registered;
    # not named, it stays awake (registered, left alone).
    try:
        rpg.register_default_process_group(accelerator_backends=("gloo",))
        out["named gloo WORLD"] = ("registered", "")
    except Exception as error:
        out["named gloo WORLD"] = (type(error), str(error))
    out["unnamed gloo WORLD"] = accelerator.outcome(rpg.register_default_process_group)
    # An accelerator group that cannot suspend is refused at creation, never left awake.
    pg_before = len(dist.distributed_c10d._world.pg_map)
    for label, cause in (("cumem", {"env": "NCCL_CUMEM_ENABLE"}), ("old nccl", {})):
        if cause:
            os.environ["NCCL_CUMEM_ENABLE"] = "0"
        else:
            s.configure(unsupported="old_nccl")
        try:
            dist.new_group([0, 1], backend=accelerator.ACCEL, group_desc=f"acc-{label}")
            out[f"accelerator {label}"] = ("created", "")
        except Exception as error:
            out[f"accelerator {label}"] = (type(error), str(error))
        os.environ.pop("NCCL_CUMEM_ENABLE", None)
        s.configure()
    out["pg_map grew"] = len(dist.distributed_c10d._world.pg_map) - pg_before
    # A strict refusal (rank 1's communicator not initialized yet), then the next destroy.
    if ctx.rank == 1:
        s.configure(uninitialized=True)
    tp = dist.new_group([0, 1], backend=s.NAME_A, group_desc="tp")
    s.configure()
    try:
        rpg.destroy_process_groups()
        out["refused"] = ("ok", "")
    except Exception as error:
        out["refused"] = (type(error), str(error))
    out["log after refusal"] = accelerator.backend_ops(s, tp, "suspend", "resume")
    tp._get_backend(torch.device("cpu")).initialize()  # the cause is gone
    out["second destroy"] = accelerator.outcome(rpg.destroy_process_groups)
    out["log after second destroy"] = accelerator.backend_ops(s, tp, "suspend", "resume")
    # Asleep: a handler for destroyed groups catches a sleeping group's refusal.
    try:
        accelerator.rank_sum(dist, torch, ctx.rank, tp)
        out["use asleep"] = None
    except Exception as error:
        out["use asleep"] = type(error)
    out["listed asleep"] = [g is tp for g in rpg.reloadable_groups()]
    out["reload"] = accelerator.outcome(rpg.reload_process_groups)
    out["listed awake"] = [g is tp for g in rpg.reloadable_groups()]
    # A reload hook that raises before the destroy: the error says what the groups are now.

    def failing(groups: list[Any]) -> None:
        raise ValueError("hook failed on purpose")

    handle = rpg.add_reload_hook(before_destroy=failing, name="failing")
    try:
        rpg.destroy_process_groups()
        out["hook"] = ("ok", "")
    except Exception as error:
        out["hook"] = (type(error), str(error))
    handle.remove()
    out["hook log"] = accelerator.backend_ops(s, tp, "suspend", "resume")[-1:]
    rpg.reload_process_groups()
    out["sum"] = accelerator.rank_sum(dist, torch, ctx.rank, tp)
    return out


@pytest.mark.timeout(240)
def test_suspend_refuses_an_accelerator_group_that_cannot_suspend() -> None:
    """``NCCL_CUMEM_ENABLE=0`` and an NCCL older than 2.29.7, on a backend that serves only an
    accelerator: ``new_group`` raises ``ModeRefusedError`` naming the group and the cause, and
    torch keeps no group of it (never a silently awake group)."""
    import reloadpg_autopatch as rpg

    for rank, out in enumerate(accelerator.run_once(_suspend_mode)):
        for label, cause in (("cumem", "NCCL_CUMEM_ENABLE=0"), ("old nccl", "2.29.7")):
            kind, text = out[f"accelerator {label}"]
            assert kind is rpg.ModeRefusedError, (rank, label, kind, text)
            assert f"acc-{label}" in text or "cannot be suspended" in text, text
            assert cause in text, (label, text)
        assert out["pg_map grew"] == 0, (rank, out["pg_map grew"])


@pytest.mark.timeout(240)
def test_after_a_strict_refusal_the_next_destroy_agrees_and_suspends() -> None:
    """A refused destroy (a member not initialized yet) suspends nothing on any rank and leaves
    the ranks awake; once the cause is gone, the next destroy (no reload in between) agrees
    and suspends the group on every rank."""
    import reloadpg_autopatch as rpg

    for rank, out in enumerate(accelerator.run_once(_suspend_mode)):
        assert out["refused"][0] is rpg.ModeRefusedError, (rank, out["refused"])
        assert out["log after refusal"] == [], (rank, out["log after refusal"])
        assert out["second destroy"] == ("ok", None), (rank, out["second destroy"])
        assert out["log after second destroy"] == [("suspend", "ok")], rank
        assert out["reload"] == ("ok", None)


@pytest.mark.timeout(240)
def test_a_handler_for_destroyed_groups_catches_a_sleeping_groups_refusal() -> None:
    """docs/api.md: ``GroupSuspendedError`` is a ``GroupDestroyedError``, so ``except
    GroupDestroyedError`` catches the use of a sleeping group."""
    import reloadpg_autopatch as rpg

    assert issubclass(rpg.GroupSuspendedError, rpg.GroupDestroyedError)
    for out in accelerator.run_once(_suspend_mode):
        assert out["use asleep"] is not None
        assert issubclass(out["use asleep"], rpg.GroupSuspendedError), out["use asleep"]
        assert issubclass(out["use asleep"], rpg.GroupDestroyedError), out["use asleep"]


@pytest.mark.timeout(240)
def test_reloadable_groups_lists_a_group_while_it_sleeps_suspended() -> None:
    """The program still holds a sleeping group, and the next reload brings it back: it is in
    ``reloadable_groups()`` asleep as awake (as a destroyed wrapper is in wrapper mode)."""
    for out in accelerator.run_once(_suspend_mode):
        assert out["listed asleep"] == [True], out["listed asleep"]
        assert out["listed awake"] == [True], out["listed awake"]


@pytest.mark.timeout(240)
def test_a_hook_error_in_suspend_mode_says_the_groups_are_suspended() -> None:
    """The destroy completed, so the groups sleep suspended: the error says so, not that they
    were destroyed (they were not), and the suspend did reach the backend."""
    import reloadpg_autopatch as rpg

    for out in accelerator.run_once(_suspend_mode):
        kind, text = out["hook"]
        assert kind is rpg.ReloadHookError, out["hook"]
        assert "'failing' raised ValueError" in text, text
        assert "suspended" in text, text
        assert "destroyed" not in text, text
        assert out["hook log"] == [("suspend", "ok")]
        assert out["sum"] == 3.0


@pytest.mark.timeout(240)
def test_in_suspend_mode_a_gloo_world_named_as_accelerator_is_refused() -> None:
    """Documented in docs/api.md: in suspend mode a WORLD named in ``accelerator_backends``
    must suspend; a gloo WORLD cannot, so the registration raises ``ModeRefusedError`` (use
    ``auto`` to swap it) and registers nothing; not named, the gloo WORLD registers and stays
    awake, as gloo groups do."""
    import reloadpg_autopatch as rpg

    for out in accelerator.run_once(_suspend_mode):
        kind, text = out["named gloo WORLD"]
        assert kind is rpg.ModeRefusedError, out["named gloo WORLD"]
        assert "WORLD (gloo) cannot be suspended" in text, text
        assert "'auto'" in text, text
        assert out["unnamed gloo WORLD"] == ("ok", None), out["unnamed gloo WORLD"]
