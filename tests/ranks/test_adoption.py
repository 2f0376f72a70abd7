"""Zero-code adoption (issue 29): an unmodified slime or miles actor runs on this package's
lifecycle.

The programs are the framework-shaped packages of ``tests/support/frameworks`` (written for
this project from the notes on the frameworks' public source): each rank imports the actor,
which binds its framework's lifecycle names at import, and drives it as the framework's
driver does. The gate (and, per case, ``SLIME_RELOADABLE_PG_MODE`` or ``_ADOPT``) is the only
thing set; no rank program calls the package. WORLD is joined the way Ray's train actor joins
it, through ``env://``, with rank 0 hosting the store.

The oracles are outside the package: the framework modules' own attributes (their ``calls``
list, their wrapper class's registry, the names the actor module holds) against the package's
public functions by identity; the suspendable stand-in's call log and creation count; torch's
objects (``dist.group.WORLD``, ``_world``'s maps) and collective results; the exception each
call raises; stderr and the exit status. Each run is kept for the session, so several tests
read one run (``_run``).
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Any

import pytest

from tests.support import actors
from tests.support.ranks import GATE, Rank, run_ranks, run_ranks_once

pytestmark = pytest.mark.timeout(240)

DEADLINE = 120.0
ADOPT = "SLIME_RELOADABLE_PG_ADOPT"
MODE = "SLIME_RELOADABLE_PG_MODE"


def _run(fn: Any, n: int = 3, **env: str) -> list[Any]:
    """``run_ranks(fn, n)`` with the gate on and ``env``, once per session for each case."""
    return run_ranks_once(fn, n, timeout=DEADLINE, env={**GATE, **env}, store_in_rank0=True)


# ---- 1. slime, the default mode: the package's lifecycle runs -------------------------------


def _slime_default(ctx: Rank) -> dict[str, Any]:
    from tests.support import frameworks

    frameworks.on_path()
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    backend = actors.accelerator_world()
    from slime.backends.megatron_utils import actor as actor_module
    from slime.utils import distributed_utils
    from slime.utils import reloadable_process_group as rpg

    import reloadpg_autopatch as pkg  # the test's oracle: the program below never calls it

    actor = actor_module.MegatronTrainRayActor()
    actor.init(actors.args(ctx, backend))
    world = dist.group.WORLD
    gloo = distributed_utils.get_gloo_group()
    out: dict[str, Any] = {"steps": actors.steps(actor)}
    report = pkg.last_cycle_report()
    out.update(
        world_one_object=dist.group.WORLD is world and c10d._get_default_group() is world,
        world_swapped_while_asleep=type(world).__name__,
        gloo_same=distributed_utils.get_gloo_group() is gloo,
        their_calls=list(rpg.calls),
        their_groups=len(rpg.ReloadableProcessGroup.GROUPS.get(os.getpid(), [])),
        their_patch_ran=bool(rpg.old_new_group_dict),
        old_new_group=callable(getattr(dist, "old_new_group", None)),
        new_group_ours=getattr(dist.new_group, "__reloadpg_autopatch__", False),
        actor_names={
            "destroy": actor_module.destroy_process_groups is pkg.destroy_process_groups,
            "reload": actor_module.reload_process_groups is pkg.reload_process_groups,
            "register": inspect.unwrap(actor_module.register_default_process_group)
            is inspect.unwrap(pkg.register_default_process_group),
            "module_destroy": rpg.destroy_process_groups is pkg.destroy_process_groups,
        },
        pair_type=type(actor.pair).__name__,
        cycle=None if report is None else report.cycle,
        destroyed=None if report is None else sorted(report.destroy.groups),
    )
    # The doctor runs while the groups are live (its mode section reads each group's backend).
    actor.wake_up()
    listed = [pkg.reloadable_groups()]
    if ctx.rank == 0:
        out["doctor"] = actors.doctor_on_adoption()
    actor.sleep()
    listed.append(pkg.reloadable_groups())
    out["world_listed"] = [any(g is dist.group.WORLD for g in groups) for groups in listed]
    out["pair_listed"] = [any(g is actor.pair for g in groups) for groups in listed]
    out["misroute"] = actors.misroute(ctx, actor.pair)
    return out


def test_slime_default_mode_runs_the_packages_lifecycle() -> None:
    """An unmodified slime actor, gate only: its calls reach the package's lifecycle (the
    cycle report counts every destroy; the framework's functions never ran, its patch never
    recorded a ``new_group``, its class holds no group, torch's ``new_group`` stays the
    package's, and ``torch.distributed.old_new_group``, which slime's Gloo group reads, is set
    as slime's patch sets it), both pairs of each step work, and WORLD (on an
    accelerator-like backend, swapped on every destroy) stays one object."""
    for rank, out in enumerate(_run(_slime_default)):
        assert out["steps"] == [actors.STEP_RESULTS[rank]] * actors.STEPS, rank
        assert out["their_calls"] == [], out["their_calls"]
        assert out["their_groups"] == 0
        assert out["their_patch_ran"] is False
        assert out["old_new_group"] is True
        assert out["new_group_ours"] is True
        assert out["actor_names"] == dict.fromkeys(out["actor_names"], True), out["actor_names"]
        if rank < 2:  # rank 2 holds torch's NON_GROUP_MEMBER for it
            assert out["pair_type"] == "ReloadableProcessGroup"
        assert out["cycle"] == actors.DESTROYS
        assert out["world_one_object"] is True
        assert out["world_swapped_while_asleep"] == "ReloadableProcessGroup"  # the stand-in


def test_reloadable_groups_leaves_out_a_registered_world_awake_and_asleep() -> None:
    """WORLD, registered by the actor and swapped while asleep, is the default group, not one
    the program holds: ``reloadable_groups()`` leaves it out awake and asleep (docs/api.md),
    and lists the actor's pair of ranks [0, 1] on its members."""
    for rank, out in enumerate(_run(_slime_default)):
        assert out["world_listed"] == [False, False], (rank, out["world_listed"])
        assert out["pair_listed"] == [rank < 2, rank < 2], (rank, out["pair_listed"])


def test_slime_gloo_group_survives_world_swaps() -> None:
    """slime makes its Gloo group before registering WORLD and uses it after each reload;
    torch's destroy of WORLD, which each swap does, would end it (torch would forget it: an
    object collective, which looks it up, would fail), so the swap leaves it alone, as every
    group the package did not make reloadable: one object, usable after every reload (each
    ``update_weights`` broadcasts rank 0's plan over it and checks what arrived)."""
    for rank, out in enumerate(_run(_slime_default)):
        assert out["gloo_same"] is True
        assert out["steps"] == [actors.STEP_RESULTS[rank]] * actors.STEPS


def test_slime_destroyed_group_raises_and_never_runs_on_world_when_adopted() -> None:
    """After the actor's destroy, a collective on the group of ranks [0, 1] raises
    ``GroupDestroyedError`` on ranks 0 and 1 and leaves the tensor alone; the WORLD sum that
    follows is every rank's, so nothing ran on WORLD."""
    for rank, out in enumerate(_run(_slime_default)):
        misroute = out["misroute"]
        assert misroute["world"] == 6.0, (rank, misroute)
        if rank < 2:
            kind, text = misroute["pair"]
            assert kind == "GroupDestroyedError", (rank, misroute)
            assert "reload_process_groups()" in text
            assert misroute["tensor"] == float(rank + 1)


def test_doctor_names_the_adopted_module_and_names() -> None:
    doctor = _run(_slime_default)[0]["doctor"]
    (seen,) = [s for s in doctor["adoption"]["seen"] if s["module"].startswith("slime.")]
    assert seen["kept"] is None
    assert set(seen["adopted"]) == {
        "monkey_patch_torch_dist",
        "register_default_process_group",
        "destroy_process_groups",
        "reload_process_groups",
    }
    assert seen["kept_jobs"] == [
        "new_group's backend 'nccl' rewritten by slime.utils.accelerator.process_group_backend"
        " (now 'nccl')",
        "torch.distributed.old_new_group",
    ], seen
    text = "\n".join(doctor["lines"])
    # slime's Gloo group, made before WORLD's registration, is left as it is by every swap
    (gloo,) = [line for line in doctor["lines"] if line.startswith("  left alone")]
    assert "(ranks [0, 1, 2], gloo): left torch's own by new_group (the wrap policy)" in gloo
    assert "slime.utils.reloadable_process_group: adopted" in text, text
    (actor,) = [line for line in doctor["lines"] if "slime.backends.megatron_utils.actor:" in line]
    assert actor.startswith("  lifecycle")
    assert "destroy_process_groups" in actor
    assert actor.endswith("-> reloadpg_autopatch"), actor
    assert not [p for p in doctor["problems"] if "lifecycle" in p], doctor["problems"]


# ---- 2. slime with SLIME_RELOADABLE_PG_ADOPT=0: the framework's own lifecycle ---------------


def _slime_kept(ctx: Rank) -> dict[str, Any]:
    from tests.support import frameworks

    frameworks.on_path()
    import torch.distributed as dist
    from slime.backends.megatron_utils import actor as actor_module
    from slime.utils import reloadable_process_group as rpg

    import reloadpg_autopatch as pkg

    actor = actor_module.MegatronTrainRayActor()
    actor.init(actors.args(ctx))
    out: dict[str, Any] = {"steps": actors.steps(actor)}
    mine = rpg.ReloadableProcessGroup.GROUPS.get(os.getpid(), [])
    out.update(
        their_calls=list(rpg.calls),
        their_groups=len(mine),
        all_destroyed=all(g.group is None for g in mine),
        pair_is_theirs=isinstance(actor.pair, rpg.ReloadableProcessGroup),
        actor_names_theirs=actor_module.destroy_process_groups is rpg.destroy_process_groups
        and rpg.destroy_process_groups is not pkg.destroy_process_groups,
        package_cycles=pkg.last_cycle_report(),
    )
    out["misroute"] = actors.misroute(ctx, actor.pair)
    # slime's own test of the module, run as it is written there: destroy, then reload.
    rpg.reload_process_groups()
    out["reloaded_live"] = all(g.group is not None for g in mine)
    if ctx.rank == 0:
        out["doctor"] = actors.doctor_on_adoption()
    dist.barrier()
    return out


def test_adopt_0_keeps_slimes_own_lifecycle() -> None:
    """``SLIME_RELOADABLE_PG_ADOPT=0``: the actor's calls reach slime's own functions (each
    destroy and reload in its ``calls``), its class holds every group it made and each one's
    ``.group`` is None after its destroy, the package's lifecycle never ran, and both pairs of
    each step work."""
    for rank, out in enumerate(_run(_slime_kept, **{ADOPT: "0", MODE: "auto"})):
        assert out["steps"] == [actors.STEP_RESULTS[rank]] * actors.STEPS, rank
        calls = out["their_calls"]
        assert calls.count("destroy_process_groups") == actors.DESTROYS, calls
        assert calls.count("reload_process_groups") == actors.RELOADS, calls
        assert calls[:2] == ["monkey_patch_torch_dist", "register_default_process_group"]
        # registered: every group is slime's (pair, three singletons, all), on every rank
        assert out["their_groups"] == 5
        assert out["all_destroyed"] is True
        assert out["pair_is_theirs"] is True
        assert out["actor_names_theirs"] is True
        assert out["package_cycles"] is None
        assert out["reloaded_live"] is True


def test_adopt_0_refuses_slimes_destroyed_group_instead_of_running_it_on_world() -> None:
    """With slime's own lifecycle, its wrapper holds ``group = None`` after a destroy and its
    patched collective hands torch ``None``; the package's guard over its functions refuses it:
    ``GroupDestroyedError`` naming the group (its class and ranks) and the call, on ranks 0 and
    1, and WORLD's sum after is every rank's."""
    for rank, out in enumerate(_run(_slime_kept, **{ADOPT: "0", MODE: "auto"})):
        misroute = out["misroute"]
        assert misroute["world"] == 6.0, (rank, misroute)
        if rank < 2:
            kind, text = misroute["pair"]
            assert kind == "GroupDestroyedError", (rank, misroute)
            assert "slime.utils.reloadable_process_group.ReloadableProcessGroup" in text, text
            assert "of ranks [0, 1]" in text, text
            assert "torch.distributed.all_reduce()" in text, text
            assert misroute["tensor"] == float(rank + 1)


def test_doctor_says_slime_keeps_its_lifecycle_and_that_its_mode_would_never_run() -> None:
    """``SLIME_RELOADABLE_PG_ADOPT=0`` with ``SLIME_RELOADABLE_PG_MODE=auto``: the doctor says
    slime keeps its own lifecycle (and why), names the actor's bindings as slime's, and flags
    the mode, which slime's own destroy and reload never reach. (``auto``, not ``suspend``: on
    torch 2.14, ``suspend`` installs the package's collectives over slime's patch later, which
    would leave the ADOPT=0 misroute test nothing of the guard's to check.)"""
    doctor = _run(_slime_kept, **{ADOPT: "0", MODE: "auto"})[0]["doctor"]
    (seen,) = [s for s in doctor["adoption"]["seen"] if s["module"].startswith("slime.")]
    assert seen["adopted"] == []
    assert f"{ADOPT}='0'" in seen["kept"]
    assert seen["guarded"] is True
    text = "\n".join(doctor["lines"])
    assert "slime.utils.reloadable_process_group: its own lifecycle" in text, text
    (actor,) = [line for line in doctor["lines"] if "slime.backends.megatron_utils.actor:" in line]
    assert actor.endswith("-> slime.utils.reloadable_process_group"), actor
    warned = [p for p in doctor["problems"] if "MODE=auto" in p and "never" in p]
    assert warned, doctor["problems"]
    assert "slime.utils.reloadable_process_group" in warned[0]


# ---- 3. slime in suspend mode on the stand-in -------------------------------------------------


def _slime_suspend(ctx: Rank) -> dict[str, Any]:
    from reloadpg_autopatch.tools import cpu_nccl as s
    from tests.support import frameworks

    frameworks.on_path()
    from slime.backends.megatron_utils import actor as actor_module
    from slime.utils import reloadable_process_group as rpg

    actor = actor_module.MegatronTrainRayActor()
    actor.init(actors.args(ctx, s.NAME_A))
    made = s.creations()
    out: dict[str, Any] = {"steps": actors.steps(actor)}
    out.update(
        creations=s.creations() - made,
        lifecycle={
            b.label: [c.op for c in s.calls(backend=b) if c.op in ("suspend", "resume")]
            for b in s.backends()
        },
        their_calls=list(rpg.calls),
        their_groups=len(rpg.ReloadableProcessGroup.GROUPS.get(os.getpid(), [])),
    )
    out["misroute"] = _misroute_asleep(ctx, actor.pair)
    return out


def _misroute_asleep(ctx: Rank, pair: Any) -> Any:
    import torch
    import torch.distributed as dist

    if ctx.rank not in (0, 1):
        return None
    t = torch.tensor([1.0])
    return actors.outcome(lambda: dist.all_reduce(t, group=pair))


def test_slime_suspend_mode_suspends_each_group_once_per_cycle_and_creates_nothing() -> None:
    """``SLIME_RELOADABLE_PG_MODE=suspend``, gate only, WORLD on the suspendable stand-in:
    each of WORLD, the group of ranks [0, 1] and the group of all ranks is suspended and
    resumed once per cycle (the stand-in's call log), the stand-in's creator never runs again
    after ``init``, slime's class holds no group, and a collective on a sleeping group raises
    ``GroupSuspendedError``."""
    expected = ["suspend", "resume"] * actors.RELOADS + ["suspend"]
    for rank, out in enumerate(_run(_slime_suspend, **{MODE: "suspend"})):
        assert out["steps"] == [actors.STEP_RESULTS[rank]] * actors.STEPS, rank
        assert out["creations"] == 0, out["creations"]
        cycled = [ops for ops in out["lifecycle"].values() if ops]
        assert cycled == [expected] * (3 if rank < 2 else 2), out["lifecycle"]
        assert out["their_calls"] == []
        assert out["their_groups"] == 0
        if rank < 2:
            assert out["misroute"][0] == "GroupSuspendedError", out["misroute"]


# ---- 4. miles: adopted, and kept (a bad switch value) -----------------------------------------


def _miles(ctx: Rank) -> dict[str, Any]:
    from tests.support import frameworks

    frameworks.on_path()
    import miles_plugins.megatron_bridge  # noqa: F401 - installs its pp-group shim at import
    import torch.distributed as dist
    from bridge_shaped import MegatronParamMapping
    from miles.backends.megatron_utils import actor as actor_module
    from miles.utils import reloadable_process_group as rpg

    import reloadpg_autopatch as pkg

    actor = actor_module.MegatronTrainRayActor()
    actor.init(actors.args(ctx, actors.accelerator_world()))
    out: dict[str, Any] = {"steps": [], "lone_reload": [], "bridge": []}
    for step in range(actors.STEPS):
        trained = actor.train(step)
        before = pkg.last_cycle_report()
        actor.wake_up()  # resident: miles still calls reload_process_groups()
        out["lone_reload"].append(pkg.last_cycle_report() is before)
        mapping = MegatronParamMapping(actor.everyone)
        out["bridge"].append(mapping.broadcast_obj_from_pp_rank({"from": ctx.rank}))
        out["bridge_group_back"] = mapping.pp_group is actor.everyone
        actor.offload()
        out["steps"].append((trained, actor.update_weights()))
    # miles' own lifecycle test: the actor's module-level names, monkeypatched with a counter.
    counted: list[tuple] = []
    real = actor_module.reload_process_groups
    actor_module.reload_process_groups = lambda *a, **k: counted.append((a, k))
    actor._asleep = False
    actor.wake_up()
    actor._asleep = True
    actor_module.reload_process_groups = real
    out.update(
        counted=counted,
        their_calls=list(rpg.calls),
        their_groups=len(rpg.ReloadableProcessGroup.GROUPS.get(os.getpid(), [])),
        their_class_kept=rpg.ReloadableProcessGroup.__module__
        == "miles.utils.reloadable_process_group",
        everyone_is_theirs=isinstance(actor.everyone, rpg.ReloadableProcessGroup),
        names_ours=actor_module.destroy_process_groups is pkg.destroy_process_groups
        and actor_module.reload_process_groups is pkg.reload_process_groups,
        cycle=getattr(pkg.last_cycle_report(), "cycle", None),
    )
    out["misroute"] = actors.misroute(ctx, actor.pair)
    dist.barrier()
    return out


#: miles' steps: train sums over all (6) then [0, 1] (12 there); the transfer gives 100.
MILES_STEPS = actors.STEP_RESULTS


def test_miles_is_adopted_with_its_guards_and_its_plugin_working() -> None:
    """An unmodified miles actor, gate only: its calls reach the package's lifecycle, also
    ``wake_up()`` while resident (a reload with nothing destroyed: no new cycle, no error);
    its plugin's ``isinstance`` test against miles' class (left in place) is False for the
    package's groups, which torch's rank lookups accept, so the broadcast gives rank 0's
    object; a collective on the destroyed group of ranks [0, 1] raises there and never runs on
    WORLD; and miles' own lifecycle test (the actor's names monkeypatched) holds."""
    for rank, out in enumerate(_run(_miles)):
        assert out["steps"] == [MILES_STEPS[rank]] * actors.STEPS, rank
        assert out["lone_reload"] == [True] * actors.STEPS
        assert out["bridge"] == [{"from": 0}] * actors.STEPS
        assert out["bridge_group_back"] is True
        assert out["counted"] == [((), {})]
        assert out["their_calls"] == []
        assert out["their_groups"] == 0
        assert out["their_class_kept"] is True
        assert out["everyone_is_theirs"] is False
        assert out["names_ours"] is True
        assert out["cycle"] == actors.DESTROYS
        misroute = out["misroute"]
        assert misroute["world"] == 6.0, misroute
        if rank < 2:
            assert misroute["pair"][0] == "GroupDestroyedError", misroute


def test_a_bad_switch_value_is_one_line_and_miles_keeps_its_own_lifecycle(capfd) -> None:
    """``SLIME_RELOADABLE_PG_ADOPT=maybe``: one stderr line naming the variable, the value and
    the accepted values (printed by the start-up of each fresh interpreter, here the ranks'
    warm parent); nothing is adopted, so miles' own lifecycle runs (its ``calls``, its class
    holding its groups, its plugin unwrapping ``.group``); the ranks finish their steps; and
    the destroyed group is still refused on ranks 0 and 1 rather than run on WORLD."""
    outs = _run(_miles, **{ADOPT: "maybe"})
    lines = [line for line in capfd.readouterr().err.splitlines() if ADOPT in line]
    assert len(lines) == 1, lines
    assert "'maybe'" in lines[0]
    assert "1, true, yes, on" in lines[0]
    assert "0, false, no, off" in lines[0]
    for rank, out in enumerate(outs):
        assert out["steps"] == [MILES_STEPS[rank]] * actors.STEPS, rank
        assert out["their_calls"].count("destroy_process_groups") == actors.DESTROYS, out[
            "their_calls"
        ]
        assert out["their_calls"].count("reload_process_groups") == actors.RELOADS + actors.STEPS
        assert out["their_groups"] == 2  # the pair and all; singletons and gloo stay raw
        assert out["everyone_is_theirs"] is True
        assert out["bridge"] == [{"from": 0}] * actors.STEPS
        assert out["names_ours"] is False
        assert out["cycle"] is None
        misroute = out["misroute"]
        assert misroute["world"] == 6.0, misroute
        if rank < 2:
            kind, text = misroute["pair"]
            assert kind == "GroupDestroyedError", misroute
            assert "of ranks [0, 1]" in text, text
            assert "torch.distributed.all_reduce()" in text, text


# ---- 5. import orders, and a module a variable names ------------------------------------------


def _orders(ctx: Rank) -> dict[str, Any]:
    from tests.support import frameworks

    frameworks.on_path()
    import torch.distributed as dist

    import reloadpg_autopatch as pkg

    # torch.distributed was patched in the warm parent, with no framework module loaded: the
    # adoption, and the lifecycle it would bring, were left unloaded.
    out: dict[str, Any] = {
        "loaded_at_start": sorted(
            name
            for name in sys.modules
            if name.startswith(
                ("reloadpg_autopatch.adoption", "reloadpg_autopatch.groups.lifecycle")
            )
        )
    }
    import slime.utils.reloadable_process_group as first

    out["before_megatron"] = first.destroy_process_groups is pkg.destroy_process_groups
    from megatron.core.tensor_parallel import mappings

    out["megatron_bound_ours"] = mappings.dist_all_gather_func is dist.all_gather_into_tensor
    for name in [m for m in sys.modules if m == "slime" or m.startswith("slime.")]:
        del sys.modules[name]
    import slime.utils.reloadable_process_group as again
    from slime.backends.megatron_utils import actor  # the actor first, after Megatron

    out["after_megatron"] = (
        again is not first
        and again.destroy_process_groups is pkg.destroy_process_groups
        and actor.destroy_process_groups is pkg.destroy_process_groups
        and actor.reload_process_groups is pkg.reload_process_groups
    )
    from miles.backends.megatron_utils import actor as miles_actor

    out["miles"] = miles_actor.destroy_process_groups is pkg.destroy_process_groups
    from forkrl import lifecycle

    out["forkrl"] = [
        getattr(lifecycle, name) is getattr(pkg, name)
        for name in ("destroy_process_groups", "reload_process_groups")
    ]
    lifecycle.monkey_patch_torch_dist()
    lifecycle.destroy_process_groups()  # before init_process_group: the package does nothing
    out["forkrl_calls"] = list(lifecycle.calls)
    return out


def test_import_orders_and_a_module_the_variable_names() -> None:
    """The lifecycle module imported before Megatron, then again after it with the actor
    importing it, and miles' actor: each time the actor's and the module's names are the
    package's, and Megatron's bindings are the patched functions; a fork's module under a name
    of its own is adopted when ``SLIME_RELOADABLE_PG_ADOPT_MODULES`` names it (its own
    functions then never run). Before any of them, the patch loaded nothing of the adoption.
    """
    (out,) = _run(_orders, 1, SLIME_RELOADABLE_PG_ADOPT_MODULES="forkrl.lifecycle")
    assert out == {
        "loaded_at_start": [],
        "before_megatron": True,
        "megatron_bound_ours": True,
        "after_megatron": True,
        "miles": True,
        "forkrl": [True, True],
        "forkrl_calls": [],
    }


def _before_torch(ctx: Rank) -> dict[str, Any]:
    from tests.support import frameworks

    frameworks.on_path()
    out: dict[str, Any] = {"torch_at_start": "torch.distributed" in sys.modules}
    from forkrl import lazy  # finishes importing before torch.distributed, unpatched

    out["unpatched_after_it"] = "reloadpg_autopatch.patching.patchset" not in sys.modules
    import torch.distributed  # noqa: F401 - the gate's patch lands here

    import reloadpg_autopatch as pkg

    out["adopted"] = [
        getattr(lazy, name) is getattr(pkg, name)
        for name in ("destroy_process_groups", "reload_process_groups")
    ]
    return out


def test_a_module_imported_before_torch_is_adopted_when_the_gates_patch_lands() -> None:
    """Gate on: a fork's lifecycle module that imports torch only inside its functions is
    imported first, before the patch exists; the gate's patch adopts it when it lands, on the
    first ``import torch.distributed``. Spawned (``fresh=True``): the subject is a process
    that has not imported torch yet, which a rank forked from the warm parent has."""
    env = {**GATE, "SLIME_RELOADABLE_PG_ADOPT_MODULES": "forkrl.lazy"}
    (out,) = run_ranks(_before_torch, 1, timeout=DEADLINE, env=env, fresh=True)
    assert out == {"torch_at_start": False, "unpatched_after_it": True, "adopted": [True, True]}


def _explicit(ctx: Rank) -> dict[str, Any]:
    from tests.support import frameworks

    frameworks.on_path()
    import reloadpg_autopatch as pkg

    assert not pkg.is_patched(), "the gate-off run is patched"
    from slime.backends.megatron_utils import actor
    from slime.utils import reloadable_process_group as rpg

    out = {"before": actor.destroy_process_groups is rpg.destroy_process_groups}
    pkg.monkey_patch_torch_dist()
    out["module"] = [
        getattr(rpg, name) is getattr(pkg, name)
        for name in ("destroy_process_groups", "reload_process_groups")
    ]
    out["actor"] = [
        getattr(actor, name) is getattr(pkg, name)
        for name in ("destroy_process_groups", "reload_process_groups")
    ]
    actor.monkey_patch_torch_dist()  # the adopted one: slime's patch never runs
    out["their_calls"] = list(rpg.calls)
    out["their_patch_ran"] = bool(rpg.old_new_group_dict)
    return out


def test_a_module_imported_before_an_explicit_patch_is_adopted_with_its_bindings() -> None:
    """Gate off: slime's actor imported first binds slime's own functions; an explicit
    ``monkey_patch_torch_dist()`` then adopts the module and points the actor's bindings at
    the package's lifecycle too."""
    (out,) = run_ranks(_explicit, 1, timeout=DEADLINE, env={"SLIME_RELOADABLE_PG": None})
    assert out == {
        "before": True,
        "module": [True, True],
        "actor": [True, True],
        "their_calls": [],
        "their_patch_ran": False,
    }


def _patched_first(ctx: Rank) -> dict[str, Any]:
    from tests.support import frameworks

    frameworks.on_path()
    import torch
    import torch.distributed as dist
    from miles.backends.megatron_utils import actor
    from miles.utils import reloadable_process_group as rpg

    import reloadpg_autopatch as pkg

    actor.monkey_patch_torch_dist()  # miles' own patch, before the package's
    if os.environ.get("TEST_RECORD") == "attribute":  # a fork that records only dist's attribute
        rpg.old_new_group_dict.pop(os.getpid())
    pkg.monkey_patch_torch_dist()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    destroyed = rpg.ReloadableProcessGroup(dist.new_group([0]), ([0],), {})
    destroyed.group = None  # as miles' destroy leaves it
    t = torch.tensor([1.0])
    return {
        "kept": [
            getattr(actor, name) is getattr(rpg, name) is not getattr(pkg, name)
            for name in ("destroy_process_groups", "reload_process_groups")
        ],
        "refused": actors.outcome(lambda: dist.all_reduce(t, group=destroyed))[0],
    }


@pytest.mark.parametrize("record", ["dict", "attribute"])
def test_a_framework_whose_own_patch_ran_first_keeps_its_lifecycle(record: str) -> None:
    """Gate off: miles' actor called its own ``monkey_patch_torch_dist()`` before the package's
    explicit patch, so miles' groups exist, wrapped by its class: the module keeps its own
    lifecycle (the actor's names stay miles'), and a destroyed miles wrapper is refused where
    miles' function would run it on WORLD (here, a 1-rank WORLD, silently). Either record of
    their patch tells that it ran: miles' per-process dict, or ``dist.old_new_group`` alone."""
    env = {"SLIME_RELOADABLE_PG": None, "TEST_RECORD": record}
    (out,) = run_ranks(_patched_first, 1, timeout=DEADLINE, env=env)
    assert out == {"kept": [True, True], "refused": "GroupDestroyedError"}
