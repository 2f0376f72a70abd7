"""Promises a mutation pass broke without a failing test (issue 33), and the smaller items.

Each test defends one promise of the docs with an oracle outside the package's lifecycle: the
stand-in's call log and creation count (``reloadpg_autopatch/tools/cpu_nccl``: what reached the
backend), torch's own results and maps (``_world.pg_map``, the sums of collectives), the pretend
device's free bytes, and the exception each call raises (checked with ``isinstance`` against the
exported classes). Several tests read one run (``run_once`` of ``tests/support/accelerator.py``
keeps each run's result for the session), so a promise has a test of its own without one more
set of ranks.

No GPU here: suspend runs on the stand-in, which is registered for the CPU by default. The
refusal of an accelerator group that cannot suspend is reached by registering the same stand-in
for an accelerator device type only (``ACCEL``, ``privateuseone``), as NCCL is for ``cuda``.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import pytest

from reloadpg_autopatch.tools import cpu_nccl as suspendable
from tests.support import accelerator
from tests.support.ranks import Rank

pytestmark = pytest.mark.timeout(240)

MiB = 2**20


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


def test_a_handler_for_destroyed_groups_catches_a_sleeping_groups_refusal() -> None:
    """docs/api.md: ``GroupSuspendedError`` is a ``GroupDestroyedError``, so ``except
    GroupDestroyedError`` catches the use of a sleeping group."""
    import reloadpg_autopatch as rpg

    assert issubclass(rpg.GroupSuspendedError, rpg.GroupDestroyedError)
    for out in accelerator.run_once(_suspend_mode):
        assert out["use asleep"] is not None
        assert issubclass(out["use asleep"], rpg.GroupSuspendedError), out["use asleep"]
        assert issubclass(out["use asleep"], rpg.GroupDestroyedError), out["use asleep"]


def test_reloadable_groups_lists_a_group_while_it_sleeps_suspended() -> None:
    """The program still holds a sleeping group, and the next reload brings it back: it is in
    ``reloadable_groups()`` asleep as awake (as a destroyed wrapper is in wrapper mode)."""
    for out in accelerator.run_once(_suspend_mode):
        assert out["listed asleep"] == [True], out["listed asleep"]
        assert out["listed awake"] == [True], out["listed awake"]


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


# ---- registration's arguments ----------------------------------------------------------------


def _registrations(ctx: Rank) -> dict[str, Any]:
    _torch, dist, rpg, _s = accelerator.start(ctx, "wrapper")
    out: dict[str, Any] = {}

    def attempt(**kwargs: Any) -> tuple[Any, str]:
        try:
            rpg.register_default_process_group(accelerator_backends=("gloo",), **kwargs)
            return ("registered", "")
        except Exception as error:
            return (type(error), str(error))

    out["accelerator only"] = attempt(temporary_backend=accelerator.ACCEL)
    out["first"] = attempt(temporary_backend="gloo")
    out["same again"] = attempt(temporary_backend="gloo")
    out["another"] = attempt(temporary_backend="cpu:gloo")
    group = dist.new_group([0, 1])
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    out["sum"] = accelerator.rank_sum(dist, _torch, ctx.rank, group)
    return out


def test_registration_refuses_a_temporary_backend_that_serves_no_cpu() -> None:
    """The temporary WORLD runs on the CPU: a backend registered for an accelerator only is
    refused with ``ValueError`` naming it and what is accepted, and nothing is registered
    (the next registration, with gloo, takes effect)."""
    for out in accelerator.run_once(_registrations):
        kind, text = out["accelerator only"]
        assert kind is ValueError, out["accelerator only"]
        assert f"temporary_backend={accelerator.ACCEL!r} serves no CPU device" in text, text
        assert "'gloo'" in text, text
        assert out["first"] == ("registered", "")


def test_a_second_registration_with_another_temporary_backend_raises() -> None:
    """Registering again with the same arguments does nothing; with another temporary backend
    it raises ``RegistrationError`` naming both, and the first registration stays in force
    (the cycle still swaps WORLD and the group works)."""
    import reloadpg_autopatch as rpg

    for out in accelerator.run_once(_registrations):
        assert out["same again"] == ("registered", "")
        kind, text = out["another"]
        assert kind is rpg.RegistrationError, out["another"]
        assert "temporary_backend='cpu:gloo' (registered: 'gloo')" in text, text
        assert out["sum"] == 3.0


# ---- auto mode -------------------------------------------------------------------------------


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


# ---- the wrap policy and single-rank groups, in every mode -----------------------------------


def _policy_in_every_mode(ctx: Rank) -> dict[str, Any]:
    torch, dist, rpg, s = accelerator.start(ctx, "wrapper")
    modes = ["wrapper", "suspend", "auto"] + (["native"] if accelerator.ON_214 else [])
    groups: dict[str, Any] = {}
    for mode in modes:
        rpg.set_reload_mode(mode)
        rpg.set_wrap_policy("none")
        groups[f"{mode} none standin"] = dist.new_group([0, 1], backend=s.NAME_A)
        groups[f"{mode} none gloo"] = dist.new_group([0, 1])
        # One the default rule would wrap: its backend serves an accelerator only.
        groups[f"{mode} none accelerator"] = dist.new_group([0, 1], backend=accelerator.ACCEL)
        rpg.set_wrap_policy("auto")
        singles = [dist.new_group([r], backend=s.NAME_A) for r in range(2)]
        groups[f"{mode} single standin"] = singles[ctx.rank]
        gloo_singles = [dist.new_group([r]) for r in range(2)]
        groups[f"{mode} single gloo"] = gloo_singles[ctx.rank]
    native = torch._C._distributed_c10d.ProcessGroup
    out: dict[str, Any] = {"types": {k: type(g) is native for k, g in groups.items()}}
    ids = {k: id(g) for k, g in groups.items()}
    calls = len(s.CALLS)
    for mode in modes:
        rpg.set_reload_mode(mode)
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
    out["lifecycle calls"] = [c.op for c in s.CALLS[calls:] if c.op in ("suspend", "resume")]
    out["same objects in torch's map"] = all(
        any(id(g) == ids[k] for g in dist.distributed_c10d._world.pg_map) for k in groups
    )
    out["sums"] = {  # an accelerator-only group takes no CPU tensor
        k: accelerator.rank_sum(dist, torch, ctx.rank, g)
        for k, g in groups.items()
        if "single" not in k and "accelerator" not in k
    }
    out["single sums"] = {
        k: accelerator.rank_sum(dist, torch, ctx.rank, g)
        for k, g in groups.items()
        if "single" in k
    }
    return out


def test_policy_none_only_unwraps_and_single_rank_groups_stay_native_in_every_mode() -> None:
    """In every mode, ``set_wrap_policy("none")`` leaves every group torch's own (the patch
    only unwraps), one on an accelerator-only backend too, and under the default policy a
    single-rank group stays torch's own even on a backend that can suspend: no cycle
    suspends, resumes or re-creates any of them (the stand-in's log, torch's map holds the
    very same objects), and each gives torch's sums."""
    for rank, out in enumerate(accelerator.run_once(_policy_in_every_mode)):
        assert all(out["types"].values()), (rank, out["types"])
        assert out["lifecycle calls"] == [], (rank, out["lifecycle calls"])
        assert out["same objects in torch's map"]
        assert set(out["sums"].values()) == {3.0}, out["sums"]
        assert set(out["single sums"].values()) == {float(rank + 1)}, out["single sums"]


# ---- the memory preflight counts WORLD ---------------------------------------------------------


def _world_short_of_memory(ctx: Rank) -> dict[str, Any]:
    torch, dist, rpg, s = accelerator.start(ctx, "suspend", world=suspendable.NAME_A)
    rpg.register_default_process_group()
    rpg.destroy_process_groups()
    # Short of WORLD's need by half a MiB (WORLD is the only group that sleeps).
    s.occupy(s.device_memory()[0] - MiB + MiB // 2)
    seen = len(s.CALLS)
    try:
        rpg.reload_process_groups()
        out: dict[str, Any] = {"first": ("ok", "")}
    except Exception as error:
        out = {"first": (type(error), str(error))}
    out["first log"] = [c.op for c in s.CALLS[seen:] if c.op in ("suspend", "resume")]
    s.occupy(None)
    out["retry"] = accelerator.outcome(rpg.reload_process_groups)
    out["sum"] = accelerator.rank_sum(dist, torch, ctx.rank)
    return out


def test_an_out_of_memory_resume_of_world_is_a_retryable_memory_short_error() -> None:
    """WORLD registered in suspend mode (on the stand-in) sleeps; the pretend device then lacks
    half a MiB of its 1 MiB need. The reload raises ``MemoryShortError`` (retryable) before any
    resume reaches the backend, never ``GroupBrokenError``; with the memory back, the retry
    resumes WORLD and it gives torch's sum."""
    import reloadpg_autopatch as rpg

    for rank, out in enumerate(accelerator.run_once(_world_short_of_memory)):
        assert out["first"][0] is rpg.MemoryShortError, (rank, out["first"])
        assert out["first log"] == [], (rank, out["first log"])
        assert out["retry"] == ("ok", None), (rank, out["retry"])
        assert out["sum"] == 3.0


# ---- a second world; a grandchild ------------------------------------------------------------


def _second_world(ctx: Rank) -> dict[str, Any]:
    torch, dist, rpg, s = accelerator.start(ctx, "suspend")
    # World 1: a gloo group is left awake (named in every destroy's agreement).
    awake = dist.new_group([0, 1], group_desc="awake-gloo")
    first_name = str(awake.group_name)
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    dist.barrier()  # every rank has read the reload's result before a peer ends the world
    dist.destroy_process_group()  # the program ends world 1
    ctx.reinit("second-world/", timedelta(seconds=30))
    # World 2 counts group names from 1 again: its first group takes world 1's awake name.
    tp = dist.new_group([0, 1], backend=s.NAME_A, group_desc="tp")
    out: dict[str, Any] = {"same name": str(tp.group_name) == first_name}
    out["destroy"] = accelerator.outcome(rpg.destroy_process_groups)
    out["log"] = accelerator.backend_ops(s, tp, "suspend")
    out["reload"] = accelerator.outcome(rpg.reload_process_groups)
    out["sum"] = accelerator.rank_sum(dist, torch, ctx.rank, tp)
    return out


def test_a_second_world_starts_with_nothing_left_awake_from_the_first() -> None:
    """A group world 1 left awake has the name world 2's first group takes; world 2's destroy
    must not count it as left awake (which would refuse it in suspend mode): it suspends."""
    for rank, out in enumerate(accelerator.run_once(_second_world)):
        assert out["same name"], rank  # else this test proves nothing
        assert out["destroy"] == ("ok", None), (rank, out["destroy"])
        assert out["log"] == [("suspend", "ok")], (rank, out["log"])
        assert out["sum"] == 3.0


def _grandchild(ctx: Rank) -> dict[str, Any]:
    import json
    import os
    import select
    import signal

    from torch.distributed import distributed_c10d as c10d

    _torch, dist, rpg, _s = accelerator.start(ctx, "wrapper", policy="all")
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # a child that leaves its parent's world and starts its own
        said: dict[str, Any] = {}
        try:
            c10d._world.default_pg = None  # left without running the parent's destructors
            store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
            dist.init_process_group("gloo", store=store, rank=0, world_size=1)
            group = dist.new_group([0])
            said["keys before"] = store.num_keys()
            grandchild = os.fork()
            if grandchild == 0:  # forked inside the child's world, holding none of its groups
                try:
                    rpg.destroy_process_groups()
                    rpg.reload_process_groups()
                finally:
                    os._exit(0)
            os.waitpid(grandchild, 0)
            said["keys after"] = store.num_keys()
            rpg.destroy_process_groups()  # the child's own cycle still works
            rpg.reload_process_groups()
            said["child sum"] = accelerator.rank_sum(dist, _torch, 0, group)
        except Exception as error:
            said["error"] = repr(error)
        finally:
            os.write(write_end, json.dumps(said).encode())
            os._exit(0)
    os.close(write_end)
    ready, _, _ = select.select([read_end], [], [], 60)
    if not ready:
        os.kill(child, signal.SIGKILL)
    with os.fdopen(read_end) as pipe:
        said = json.loads(pipe.read() or "{}")
    os.waitpid(child, 0)
    return said


def test_a_grandchild_belongs_to_its_parents_world_not_its_grandparents() -> None:
    """A forked child leaves its parent's world, starts its own (one rank, on a TCPStore it
    hosts) and makes a reloadable group; a grandchild forked there holds none of the child's
    groups, so its destroy and reload must not take part in the child's steps: the child's
    store holds the same keys after the grandchild's cycle (``num_keys()``), and the child's
    own cycle still works."""
    (out,) = accelerator.run_once(_grandchild, 1)
    assert "error" not in out, out
    assert out["keys after"] == out["keys before"], out
    assert out["child sum"] == 1.0
