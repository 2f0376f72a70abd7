"""In concert with the framework's actor (issue 37, and the adoption items of issue 38).

A cycle touches only what the package made: a group made outside ``new_group`` (slime's
weight-update group, made by its copy of ``init_process_group`` with torch's
``_new_process_group_helper`` on a store of its own) comes through every cycle, WORLD's swap
included, as it was. Adoption keeps what the framework's patch does besides its lifecycle (the
backend rewrite of slime PR #2216, ``torch.distributed.old_new_group``), asks nothing of the
framework its own registration does not, survives ``importlib.reload`` of the framework's
module, and says what to call when a framework wrapper is refused.

Every rank is activated by the gate alone; the frameworks are the stand-ins of
``tests/support/frameworks`` (written for this project from notes on their public source). The
oracles are outside the package: a spy on torch's ``ProcessGroup.shutdown`` and ``abort``, the
suspendable stand-in's own call log and ``memory_stats()``, torch's ``_world`` maps and name
registry, ``torch.distributed.get_backend``, collective results, the framework modules' own
``calls`` lists, and the exceptions raised.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import pytest

from tests.support import actors
from tests.support.ranks import GATE, Rank, run_ranks_once, total

pytestmark = pytest.mark.timeout(240)

DEADLINE = 120.0
ADOPT = "SLIME_RELOADABLE_PG_ADOPT"
#: Cycles the weight-update group goes through with WORLD swapped twice in each.
CYCLES = 50
#: slime's name for the weight-update group of pipeline stage 0.
WEIGHTS = "slime-pp_0"
#: The MUSA communication backend slime PR #2216 rewrites "nccl" to (here gloo-backed).
MCCL = "mccl"


def _run(fn: Any, n: int = 2, *, host0: bool = True, **env: str | None) -> list[Any]:
    """``run_ranks(fn, n)`` with the gate on and ``env``, once per session for each case.

    ``host0``: rank 0 hosts the store, as Ray's train actor's WORLD (``env://``) does; a
    program that ends its WORLD and starts another on the same store needs the launcher's."""
    return run_ranks_once(fn, n, timeout=DEADLINE, env={**GATE, **env}, store_in_rank0=host0)


# ---- what the programs share ----------------------------------------------------------------


class _Spy:
    """Every ``shutdown()`` and ``abort()`` torch's ``ProcessGroup`` receives, by group name."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.seen: list[tuple[str, str]] = []
        for method in ("shutdown", "abort"):
            real = getattr(dist.ProcessGroup, method)

            def spy(group: Any, *args: Any, _method: str = method, _real: Any = real) -> Any:
                self.seen.append((_method, _name(group)))
                return _real(group, *args)

            setattr(dist.ProcessGroup, method, spy)

    def of(self, name: str) -> list[str]:
        return [method for method, seen in self.seen if seen == name]


def _name(group: Any) -> str:
    try:
        return str(group.group_name)
    except Exception:
        return "?"


def _entries(group: Any) -> dict[str, Any]:
    """What torch keeps of ``group``: its entry in each ``_world`` map, its tags, and what its
    name resolves to in torch's registry."""
    from torch.distributed import distributed_c10d as c10d

    world = c10d._world
    backend, store = world.pg_map.get(group, (None, None))
    name = world.pg_names.get(group)
    try:
        resolves = c10d._resolve_process_group(name) is group
    except Exception as error:
        resolves = f"{type(error).__name__}: {error}"
    return {
        "pg_map": (backend, id(store)),
        "pg_names": name,
        "pg_group_ranks": world.pg_group_ranks.get(group),
        "pg_backend_config": world.pg_backend_config.get(group),
        "pg_to_tag": world.pg_to_tag.get(group),
        "tags_to_pg": sorted(t for t, groups in world.tags_to_pg.items() if group in groups),
        "resolves": resolves,
    }


def _weights_group(ctx: Rank, backend: str = "gloo") -> Any:
    """slime's weight-update group over every rank, on a store of its own (a prefix of its own
    on a client of its own to the launcher's store), made by slime's ``init_process_group``."""
    import torch.distributed as dist
    from slime.utils import distributed_utils

    store = dist.PrefixStore(
        f"{WEIGHTS}/", dist.TCPStore(ctx.host, ctx.port, ctx.world_size, is_master=False)
    )
    return distributed_utils.init_process_group(
        backend=backend,
        store=store,
        world_size=ctx.world_size,
        rank=ctx.rank,
        group_name=WEIGHTS,
        timeout=timedelta(seconds=30),
    )


# ---- 1. a group made outside new_group, through 50 cycles with WORLD swapped ----------------


def _left_alone(ctx: Rank) -> dict[str, Any]:
    from tests.support import frameworks

    frameworks.on_path()
    import reloadpg_autopatch as pkg

    spy = _Spy()
    dist = ctx.begin(world=True)  # WORLD registered, and swapped on every destroy
    everyone = dist.new_group(list(range(ctx.world_size)))
    weights = _weights_group(ctx)
    expected = float(sum(range(1, ctx.world_size + 1)))
    before = _entries(weights)
    out: dict[str, Any] = {"changed": [], "wrong": [], "refused": set()}
    for cycle in range(CYCLES):
        pkg.destroy_process_groups()
        asleep = total(weights, ctx.rank + 1)
        out["refused"].add(actors.outcome(lambda: total(everyone, 1.0))[0])
        if cycle == 0:
            out["report"] = pkg.last_cycle_report().to_dict()
        pkg.reload_process_groups()
        awake = total(weights, ctx.rank + 1), total(everyone, ctx.rank + 1)
        if (asleep, *awake) != (expected,) * 3:
            out["wrong"].append((cycle, asleep, awake))
        now = _entries(weights)
        if now != before:
            out["changed"].append((cycle, now))
    out.update(
        before=before,
        shut=spy.of(WEIGHTS),
        shut_any=len(spy.seen),
        ranks=dist.get_process_group_ranks(weights),
        backend=str(dist.get_backend(weights)),
    )
    if ctx.rank == 0:
        from reloadpg_autopatch.tools import doctor

        out["doctor"] = [
            line for line in doctor.render(doctor.diagnose()).splitlines() if "left alone" in line
        ]
    return out


def test_a_group_made_outside_new_group_comes_through_50_swaps_as_it_was() -> None:
    """slime's weight-update group (``_new_process_group_helper`` on a store of its own),
    WORLD registered and swapped for a temporary WORLD at each of 50 destroys and restored at
    each reload: torch's ``shutdown()``/``abort()`` never reach it (while the package's own
    groups and WORLDs do get theirs: the spy works), its entries in every ``_world`` map and its
    name in torch's registry are the same after every cycle, its all_reduce gives every rank's
    sum asleep and awake, while the package's group is refused asleep. 2 ranks x 50 cycles,
    each two WORLD creations: about 5 s."""
    for rank, out in enumerate(_run(_left_alone)):
        assert out["shut"] == [], (rank, out["shut"])
        assert out["shut_any"] > 0  # the spy sees the shutdowns torch does make
        assert out["before"]["pg_names"] == WEIGHTS
        assert out["before"]["resolves"] is True
        assert out["changed"] == [], out["changed"][:1]
        assert out["wrong"] == [], out["wrong"][:3]
        assert out["refused"] == {"GroupDestroyedError"}
        assert out["ranks"] == [0, 1]
        assert out["backend"] == "gloo"


def test_the_cycle_report_and_the_doctor_list_the_group_left_alone_and_why() -> None:
    for out in _run(_left_alone):
        left = out["report"]["destroy"]["left_alone"]
        assert left == {
            WEIGHTS: {
                "ranks": [0, 1],
                "backend": "gloo",
                "why": "made outside new_group",
                "memory": None,  # gloo tells no memory
            }
        }, left
    lines = _run(_left_alone)[0]["doctor"]
    left = [line for line in lines if line.startswith("  left alone")]
    assert len(left) == 1, lines
    assert repr(WEIGHTS) in left[0], lines
    assert "made outside new_group" in left[0], lines


def _left_alone_suspending(ctx: Rank) -> dict[str, Any]:
    from reloadpg_autopatch.tools import cpu_nccl as s
    from tests.support import frameworks

    frameworks.on_path()
    import torch.distributed as dist

    import reloadpg_autopatch as pkg

    ctx.init(backend=s.NAME_A)  # WORLD suspends in place, as an NCCL WORLD does
    pkg.register_default_process_group(timedelta(seconds=30))
    everyone = dist.new_group(list(range(ctx.world_size)))
    made = len(s.backends(s.NAME_A))
    weights = _weights_group(ctx, s.NAME_A)
    (backend,) = s.backends(s.NAME_A)[made:]
    stats = backend.memory_stats()
    sums = []
    for _ in range(3):
        pkg.destroy_process_groups()
        report = pkg.last_cycle_report().to_dict()
        sums.append(total(weights, 1.0))
        pkg.reload_process_groups()
        sums.append(total(everyone, 1.0))
    return {
        "sums": sums,
        "suspended_ours": bool(s.calls("suspend")),
        "stats": stats,
        "left_alone": report["destroy"]["left_alone"],
        "ops": sorted({c.op for c in s.calls(backend=backend)} - {"memory_stats"}),
    }


def test_a_left_alone_group_in_suspend_mode_is_never_suspended_and_its_memory_is_reported() -> None:
    """The weight-update group on the suspendable stand-in (a backend that tells its memory,
    as NCCL's ``memory_stats()`` does) beside a WORLD and a group of the package's on it,
    ``SLIME_RELOADABLE_PG_MODE=suspend``: no cycle suspends, resumes, shuts down or aborts it
    (the stand-in's own call log) while the package's groups are suspended, it works asleep, and
    the cycle report shows what its backend says it holds."""
    for out in _run(_left_alone_suspending, SLIME_RELOADABLE_PG_MODE="suspend"):
        assert out["ops"] == [], out["ops"]
        assert out["suspended_ours"] is True
        assert out["sums"] == [2.0] * 6
        (entry,) = out["left_alone"].values()
        assert entry["why"] == "made outside new_group"
        assert entry["memory"] == {"cpu": out["stats"]}, entry


# ---- 2. where torch would reach such a group anyway: a refusal on every rank -----------------


def _refused(ctx: Rank) -> dict[str, Any]:
    from tests.support import frameworks

    frameworks.on_path()
    import logging

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch as pkg

    spy = _Spy()
    ctx.begin()
    held: dict[Any, str] = {}
    if ctx.rank == 0:
        # A group of rank 0 alone, made outside new_group (the trainer's side of a group with
        # the rollout engines), which a torch of the future also keeps in a map of its own.
        mine = Rank(0, 1, ctx.port)
        weights = _weights_group(mine)
        held[weights] = "state"
    warned: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warned.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("reloadpg_autopatch").addHandler(handler)
    c10d._World.pg_future_state = property(lambda self: held)
    try:
        pkg.register_default_process_group(timedelta(seconds=30), accelerator_backends=("gloo",))
        everyone = dist.new_group(list(range(ctx.world_size)))
        world = dist.group.WORLD
        outcome = actors.outcome(pkg.destroy_process_groups)
    finally:
        del c10d._World.pg_future_state
        logging.getLogger("reloadpg_autopatch").removeHandler(handler)
    out = {
        "warned": [line for line in warned if "pg_future_state" in line],
        "outcome": outcome,
        "everyone_awake": total(everyone, 1.0),
        "world_same_native": dist.group.WORLD is world,
        "shut": list(spy.seen),
    }
    pkg.destroy_process_groups()  # the torch we know: it goes on
    pkg.reload_process_groups()
    out["after"] = total(everyone, 1.0)
    if ctx.rank == 0:
        out["weights"] = total(weights, 5.0)
    return out


def test_where_torch_would_reach_a_group_left_alone_every_rank_refuses_before_anything_is_freed():
    """A torch that kept per-group state where WORLD's swap cannot carry it (here: a new
    ``_world`` property, holding a group only rank 0 has): the registration warns on rank 0,
    where the group exists; the destroy refuses on both ranks, naming the group and the place,
    before anything is freed (no shutdown, the package's group still works, WORLD unchanged);
    without it the cycle runs, and the group still works."""
    for rank, out in enumerate(_run(_refused)):
        assert len(out["warned"]) == (rank == 0), out["warned"]
        kind, text = out["outcome"]
        assert kind == "ReloadPGError", (rank, out["outcome"])
        assert repr(WEIGHTS) in text, text
        assert "_world.pg_future_state" in text, text
        assert "Nothing was destroyed" in text, text
        assert out["shut"] == []
        assert out["everyone_awake"] == 2.0
        assert out["world_same_native"] is True
        assert out["after"] == 2.0
        if rank == 0:
            assert out["weights"] == 5.0


# ---- 3. the framework patch's other jobs: the backend rewrite, old_new_group ------------------


def _mccl_backend() -> None:
    """Register ``mccl``: a gloo-backed backend of that name (CPU has no MUSA device)."""
    import torch.distributed as dist

    if MCCL not in dist.Backend.backend_list:

        def create(store: Any, rank: int, size: int, timeout: Any) -> Any:
            return dist.ProcessGroupGloo(store, rank, size, timeout)

        dist.Backend.register_backend(MCCL, create, devices=["cpu"])


def _on_musa(ctx: Rank) -> dict[str, Any]:
    from tests.support import frameworks

    frameworks.on_path()
    _mccl_backend()
    import torch.distributed as dist
    from slime.backends.megatron_utils import actor as actor_module
    from slime.utils import reloadable_process_group as rpg

    import reloadpg_autopatch as pkg

    actor = actor_module.MegatronTrainRayActor()
    args = actors.args(ctx, "nccl")  # slime's default; its accelerator makes it mccl on MUSA
    actor.init(args)  # ends asleep
    actor.wake_up()
    # Megatron asks for "nccl" by name for some of its groups (expert and hybrid ones).
    asked = dist.new_group(list(range(ctx.world_size)), backend="nccl")
    backends = {"world": str(dist.get_backend()), "asked": str(dist.get_backend(asked))}
    sums = []
    for _ in range(2):
        actor.sleep()
        actor.wake_up()
        sums.append(total(asked, 1.0))
        backends["asked_after_reload"] = str(dist.get_backend(asked))
    out = {
        "backends": backends,
        "sums": sums,
        "old_new_group": getattr(dist, "old_new_group", None) is not None,
        "their_calls": list(rpg.calls),
        "adopted": actor_module.destroy_process_groups is pkg.destroy_process_groups,
    }
    if ctx.rank == 0:
        out["doctor"] = actors.doctor_on_adoption()
    return out


def test_slimes_rewrite_takes_worlds_backend_where_new_group_names_none(monkeypatch) -> None:
    """As slime's ``new_group`` does, the kept rewrite asks the accelerator for WORLD's backend
    where the call names none, and for a backend named ``"nccl"``; another name stays. On
    MUSA slime's WORLD is already ``mccl``, so the rank test above never meets an ``nccl``
    WORLD: no CPU can start one, so torch's answer for WORLD's backend is stood in here."""
    import types

    import torch.distributed as dist

    from reloadpg_autopatch.adoption import jobs

    asked: list[str] = []

    def process_group_backend(backend: str) -> str:
        asked.append(backend)
        return MCCL if backend == "nccl" else backend

    module = types.ModuleType("myfork.utils.reloadable_process_group")
    module.accelerator = types.SimpleNamespace(  # type: ignore[attr-defined]
        __name__="myfork.utils.accelerator", process_group_backend=process_group_backend
    )
    found = jobs._backend_rewrite(module)
    assert found is not None
    rewrite = found[1]
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")  # an NCCL WORLD
    assert rewrite(([0, 1],), {}) == (([0, 1],), {"backend": MCCL})
    assert rewrite(([0, 1], None, "nccl"), {}) == (([0, 1], None, MCCL), {})
    assert rewrite(([0, 1],), {"backend": "gloo"}) == (([0, 1],), {"backend": "gloo"})
    assert asked[-2:] == ["nccl", "nccl"], asked


@pytest.mark.parametrize("adopt", ["1", "0"])
def test_slime_on_musa_gets_mccl_groups_with_adoption_on_and_off(adopt: str) -> None:
    """slime's actor on a MUSA machine (``mccl``, here a gloo-backed backend of that name):
    WORLD and a group Megatron asks for by the name ``"nccl"`` are ``mccl`` groups, before and
    after each reload, and work, whether the package adopts slime's lifecycle (which must then
    keep slime's rewrite) or slime keeps its own (``SLIME_RELOADABLE_PG_ADOPT=0``);
    ``torch.distributed.old_new_group`` is set in both, as slime's patch sets it."""
    outs = _run(_on_musa, **{ADOPT: adopt, "SLIME_ACCELERATOR": "musa"})
    for out in outs:
        assert out["backends"] == dict.fromkeys(("world", "asked", "asked_after_reload"), MCCL)
        assert out["sums"] == [2.0, 2.0]
        assert out["old_new_group"] is True
        assert out["adopted"] is (adopt == "1")
        assert ("monkey_patch_torch_dist" in out["their_calls"]) is (adopt == "0")


def test_the_doctor_says_what_adoption_kept_of_slimes_patch() -> None:
    doctor = _run(_on_musa, **{ADOPT: "1", "SLIME_ACCELERATOR": "musa"})[0]["doctor"]
    (seen,) = [s for s in doctor["adoption"]["seen"] if s["module"].startswith("slime.")]
    assert seen["kept"] is None
    assert seen["kept_jobs"] == [
        "new_group's backend 'nccl' rewritten by slime.utils.accelerator.process_group_backend"
        " (now 'mccl')",
        "torch.distributed.old_new_group",
    ], seen
    text = "\n".join(doctor["lines"])
    assert "kept of its patch: new_group's backend 'nccl' rewritten" in text, text


# ---- 4. the adopted registration asks no more than slime's own, and keeps its arguments --------


def _registration(ctx: Rank) -> dict[str, Any]:
    from tests.support import frameworks

    frameworks.on_path()
    import torch.distributed as dist
    from slime.utils import distributed_utils
    from slime.utils import reloadable_process_group as rpg
    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch as pkg

    timeout = timedelta(seconds=30)
    asked = {"accelerator_backends": ("gloo",), "temporary_backend": "cpu:gloo"}
    ctx.init(timeout=30)
    out: dict[str, Any] = {}
    # World 1: slime's Gloo group was never made (get_gloo_group() raises).
    out["no_gloo_group"] = actors.outcome(
        lambda: rpg.register_default_process_group(timeout, **asked)
    )
    out["again_public"] = actors.outcome(
        lambda: pkg.register_default_process_group(timeout, **asked)
    )
    pkg.destroy_process_groups()
    out["temporary_config"] = str(dist.get_backend_config())
    pkg.reload_process_groups()
    out["restored_config"] = str(dist.get_backend_config())
    dist.destroy_process_group()
    # World 2: the Gloo group made first, as slime's actor makes it; WORLD registered twice.
    ctx.reinit("second/", timeout)
    gloo = distributed_utils.init_gloo_group()
    count = c10d._world.group_count
    rpg.register_default_process_group(timeout, accelerator_backends=("gloo",))
    rpg.register_default_process_group(timeout, accelerator_backends=("gloo",))
    out["gloo_same"] = distributed_utils.get_gloo_group() is gloo
    out["created"] = c10d._world.group_count - count
    sums = []
    for _ in range(2):
        pkg.destroy_process_groups()
        sums.append(total(distributed_utils.get_gloo_group(), 1.0))
        pkg.reload_process_groups()
        sums.append(total(distributed_utils.get_gloo_group(), 1.0))
    out["gloo_sums"] = sums
    out["still_same"] = distributed_utils.get_gloo_group() is gloo
    # A pass-through layer over new_group (a profiler's) after adoption set old_new_group: it
    # wraps nothing, so new_group still hands it reloadable groups.
    ours = dist.new_group

    def profiled(*args: Any, **kwargs: Any) -> Any:
        return ours(*args, **kwargs)

    dist.new_group = profiled
    try:
        out["through_a_layer"] = type(dist.new_group([0, 1])).__name__
    finally:
        dist.new_group = ours
    return out


def test_the_adopted_registration_needs_no_gloo_group_and_keeps_its_arguments() -> None:
    """Through slime's name: the registration works where slime's Gloo group was never made
    (slime's own registration needs none); ``temporary_backend`` reaches the package (the
    temporary WORLD is ``cpu:gloo`` only, and the same call through the package's own name is
    the same registration, not a ``RegistrationError``); registered twice after the Gloo group
    was made, the group is the same object, nothing is created for it, and it works asleep and
    awake."""
    for out in _run(_registration, host0=False):
        assert out["no_gloo_group"] == ("no error", None), out["no_gloo_group"]
        assert out["again_public"] == ("no error", None), out["again_public"]
        assert out["temporary_config"] == "cpu:gloo"
        assert out["restored_config"] != "cpu:gloo"
        assert out["gloo_same"] is True
        assert out["created"] == 0
        assert out["gloo_sums"] == [2.0] * 4
        assert out["still_same"] is True
        # the old_new_group adoption set declares no outer layer that wraps groups
        assert out["through_a_layer"] == "ReloadableProcessGroup"


# ---- 5. importlib.reload() of the framework's module ----------------------------------------


def _reexecuted(ctx: Rank) -> dict[str, Any]:
    from tests.support import frameworks

    frameworks.on_path()
    import importlib

    from slime.utils import reloadable_process_group as rpg

    import reloadpg_autopatch as pkg

    adopted = os.environ.get(ADOPT) != "0"
    backend = actors.accelerator_world() if adopted else "gloo"  # WORLD swapped when adopted
    importlib.reload(rpg)
    importlib.reload(rpg)
    from slime.backends.megatron_utils import actor as actor_module

    names = ("destroy_process_groups", "reload_process_groups")
    out: dict[str, Any] = {"module_names_ours": [getattr(rpg, n) is getattr(pkg, n) for n in names]}
    actor = actor_module.MegatronTrainRayActor()
    actor.init(actors.args(ctx, backend))
    out["steps"] = actors.steps(actor)
    out["their_calls"] = list(rpg.calls)
    out["misroute"] = actors.misroute(ctx, actor.pair)
    return out


@pytest.mark.parametrize("adopt", ["1", "0"])
def test_a_reexecuted_framework_module_is_adopted_again_and_its_destroyed_group_refused(
    adopt: str,
) -> None:
    """``importlib.reload()`` of slime's module (twice) before the actor imports it: adopted,
    its names are the package's again and slime's own functions never run; kept
    (``SLIME_RELOADABLE_PG_ADOPT=0``), its patch is guarded again. Either way a collective on
    the destroyed group of ranks [0, 1] raises there and never runs on WORLD (whose sum after
    is every rank's)."""
    for rank, out in enumerate(_run(_reexecuted, 3, **{ADOPT: adopt})):
        assert out["steps"] == [actors.STEP_RESULTS[rank]] * 2, rank
        if adopt == "1":
            assert out["module_names_ours"] == [True, True]
            assert out["their_calls"] == []
        else:
            assert out["their_calls"][0] == "monkey_patch_torch_dist"
        misroute = out["misroute"]
        assert misroute["world"] == 6.0, (rank, misroute)
        if rank < 2:
            assert misroute["pair"][0] == "GroupDestroyedError", (rank, misroute)


# ---- 6. a framework wrapper refused after adoption says what to call ---------------------------


def _their_wrapper(ctx: Rank) -> dict[str, Any]:
    from tests.support import frameworks

    frameworks.on_path()
    import torch
    from slime.utils import reloadable_process_group as rpg

    import reloadpg_autopatch as pkg

    dist = ctx.begin()
    theirs = rpg.ReloadableProcessGroup(
        dist.new_group([0, 1]), [0, 1], creation_args=([0, 1],), backend="gloo"
    )
    rpg.ReloadableProcessGroup.destroy_process_groups()  # its class's own destroy
    t = torch.tensor([1.0])
    refused = actors.outcome(lambda: dist.all_reduce(t, group=theirs))
    rpg.reload_process_groups()  # the framework's name: reloadpg_autopatch's after adoption
    return {
        "adopted": rpg.reload_process_groups is pkg.reload_process_groups,
        "refused": refused,
        "restored_by_the_framework_name": theirs.group is not None,
    }


def test_a_refused_framework_wrapper_after_adoption_says_what_to_call() -> None:
    """Adopted, slime's ``reload_process_groups`` is the package's, which never restores a
    wrapper of slime's class (shown: it is still empty after that call); so the refusal does
    not send the program there, and names what works: ``torch.distributed.new_group`` (whose
    groups the package restores) or ``SLIME_RELOADABLE_PG_ADOPT=0``."""
    for out in _run(_their_wrapper):
        assert out["adopted"] is True
        assert out["restored_by_the_framework_name"] is False
        kind, text = out["refused"]
        assert kind == "GroupDestroyedError", out["refused"]
        assert "call the framework's reload_process_groups()" not in text, text
        assert "slime.utils.reloadable_process_group is adopted" in text, text
        assert "torch.distributed.new_group()" in text, text
        assert f"{ADOPT}=0" in text, text


# ---- 7. vime's older module ------------------------------------------------------------------


def _vime(ctx: Rank) -> dict[str, Any]:
    from tests.support import frameworks

    frameworks.on_path()
    actors.accelerator_world()
    import torch.distributed as dist
    from vime.backends.megatron_utils import actor as actor_module
    from vime.utils import distributed_utils
    from vime.utils import reloadable_process_group as rpg

    import reloadpg_autopatch as pkg

    actor = actor_module.MegatronTrainRayActor()
    actor.init(actors.args(ctx, actors.ACCEL_WORLD))
    gloo = distributed_utils.get_gloo_group()
    world = dist.group.WORLD
    steps = [actor.train(step) for step in range(2)]
    return {
        "steps": steps,
        "their_calls": list(rpg.calls),
        "their_groups": len(rpg.ReloadableProcessGroup.GROUPS.get(os.getpid(), [])),
        "names_ours": [
            getattr(actor_module, n) is getattr(pkg, n)
            for n in ("destroy_process_groups", "reload_process_groups")
        ],
        "gloo_same": distributed_utils.get_gloo_group() is gloo,
        "world_same": dist.group.WORLD is world,
        "cycle": pkg.last_cycle_report().cycle,
        "misroute": actors.misroute(ctx, actor.pair),
    }


def test_vimes_older_module_is_adopted() -> None:
    """vime's actor (slime's older shape: per-group teardown, ``nccl_world_destroyed``, no
    backend rewrite), gate only, WORLD on an accelerator-like backend: its calls reach the
    package's lifecycle (vime's functions never run, its class holds no group), each step's
    sums are right, WORLD and vime's Gloo group stay one object each across the swaps, and a
    collective on the destroyed pair is refused rather than run on WORLD."""
    for rank, out in enumerate(_run(_vime, 3)):
        assert out["steps"] == [actors.STEP_RESULTS[rank][0]] * 2, rank
        assert out["their_calls"] == []
        assert out["their_groups"] == 0
        assert out["names_ours"] == [True, True]
        assert out["gloo_same"] is True
        assert out["world_same"] is True
        assert out["cycle"] == 3
        misroute = out["misroute"]
        assert misroute["world"] == 6.0, (rank, misroute)
        if rank < 2:
            assert misroute["pair"][0] == "GroupDestroyedError", (rank, misroute)
