"""What torch is taught: every function that takes a group, and the patches layered on ours.

A second patch layered on ours (slime's actor does that) keeps both layers working; a
pass-through shim over ``new_group`` keeps groups reloadable, and a layer that declares it wraps
(``torch.distributed.old_new_group``) gets native groups and a warning; every function annotated
with ``ProcessGroup`` (also as a string, in a union, or through dotted aliases several levels
deep) is patched, and its generated wrapper unwraps a reloadable group; a module under the
``SLIME_RELOADABLE_PG_REBIND`` prefixes is swept when it finishes importing.

Oracles: ``inspect`` with a rule written here against torch's own annotations, the native groups
torch builds (a spy at ``_new_process_group_helper``), object identity, collective results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.support import gated, patched_ranks, this_tree
from tests.support.programs import slime_like
from tests.support.ranks import Rank, pg_count, run_ranks, total

if TYPE_CHECKING:  # only a type checker sees it: the probes of the rule test name it as text
    from torch.distributed import ProcessGroup

pytestmark = pytest.mark.timeout(300)

# ---- a second patch layered on ours --------------------------------------------------------------


def _layered(ctx: Rank) -> dict:
    import torch

    import reloadpg_autopatch
    from reloadpg_autopatch.groups import registry

    dist = ctx.patched()
    ours = dist.new_group([0, 1])
    bound_all_gather = dist.all_gather_into_tensor  # a Megatron-style binding of our wrapper
    records_before = len(registry.records())

    slime_class, slime_destroy, slime_reload = slime_like.apply()
    theirs = dist.new_group([0, 1])
    their_sub, _ = dist.new_subgroups(2)  # torch's helper creates through the outer new_group
    out = {
        "their_subgroup_type": type(their_sub).__name__,
        "theirs_type": type(theirs).__name__,
        "inner_type": type(theirs.group).__name__,
        "records_added": len(registry.records()) - records_before,  # not even subgroups
    }

    def gather(func, group):
        buffer = torch.zeros(4)
        func(buffer, torch.full((2,), float(ctx.rank)), group=group)
        return buffer.tolist()

    def total(group):
        t = torch.tensor([ctx.rank + 1.0])
        dist.all_reduce(t, group=group)
        return t.item()

    out["their_group_via_their_patch"] = [
        total(theirs),
        gather(dist.all_gather_into_tensor, theirs),
    ]
    out["their_group_via_our_binding"] = gather(bound_all_gather, theirs)
    try:  # torch's own all_gather_single hands their class to the C++ trampoline
        gather(reloadpg_autopatch._originals.original("all_gather_single"), theirs)
        out["their_group_unpatched"] = "no error"
    except Exception as error:
        out["their_group_unpatched"] = type(error).__name__
    # A binding made before any patch: torch's original delegates to distributed_c10d's
    # all_gather_single by name, which is ours there, so even it works.
    out["their_group_stale_binding"] = gather(
        reloadpg_autopatch._originals.original("all_gather_into_tensor"), theirs
    )
    out["our_group_via_their_patch"] = [total(ours), gather(dist.all_gather_into_tensor, ours)]

    # Each layer destroys and reloads its own groups; neither disturbs the other.
    reloadpg_autopatch.destroy_process_groups()
    out["theirs_alive_while_ours_sleep"] = total(theirs)
    reloadpg_autopatch.reload_process_groups()
    slime_destroy()
    out["ours_alive_while_theirs_sleep"] = total(ours)
    slime_reload()
    out["after_both_reloaded"] = [total(ours), total(theirs), type(theirs.group).__name__]
    out["is_slime_class"] = isinstance(theirs, slime_class)
    return out


@pytest.mark.timeout(180)
def test_outermost_patch_wraps_and_both_layers_keep_working() -> None:
    for report in run_ranks(_layered, 2):
        assert report["theirs_type"] == "SlimeLikeGroup"
        assert report["their_subgroup_type"] == "SlimeLikeGroup"
        assert report["inner_type"] == "ProcessGroup"  # not wrapped twice
        assert report["records_added"] == 0
        assert report["their_group_via_their_patch"] == [3.0, [0.0, 0.0, 1.0, 1.0]]
        assert report["their_group_via_our_binding"] == [0.0, 0.0, 1.0, 1.0]
        assert report["their_group_unpatched"] != "no error"  # their class alone is broken
        assert report["their_group_stale_binding"] == [0.0, 0.0, 1.0, 1.0]
        assert report["our_group_via_their_patch"] == [3.0, [0.0, 0.0, 1.0, 1.0]]
        assert report["theirs_alive_while_ours_sleep"] == 3.0
        assert report["ours_alive_while_theirs_sleep"] == 3.0
        assert report["after_both_reloaded"] == [3.0, 3.0, "ProcessGroup"]
        assert report["is_slime_class"]


# ---- shims over new_group ----------------------------------------------------------------


def _pass_through_shim(ctx: Rank) -> dict:
    import reloadpg_autopatch as rpg

    dist = ctx.patched("all")
    spy = patched_ranks.NativeSpy()
    calls = []
    inner = dist.new_group

    def logged(*args: Any, **kwargs: Any) -> Any:  # a logging layer applied after ours
        calls.append(args)
        return inner(*args, **kwargs)

    dist.new_group = logged
    made = {}
    group = None

    def create() -> None:
        nonlocal group
        group = dist.new_group([0, 1])

    made["natives"] = spy.during(create)
    report = {
        "calls": len(calls),
        "natives": made["natives"],
        "reloadable": isinstance(group, rpg.ReloadableProcessGroup),
        "sum": total(group, ctx.rank + 1),
    }
    rpg.destroy_process_groups()
    report["pg_count_destroyed"] = pg_count()
    report["reloaded"] = spy.during(rpg.reload_process_groups)
    report["sum_after"] = total(group, ctx.rank + 1)
    return report


def test_a_pass_through_shim_keeps_groups_reloadable() -> None:
    """A logging or profiling layer over ``new_group`` must not turn reloadability off."""
    for report in run_ranks(_pass_through_shim, 2, timeout=120):
        assert report["calls"] == 1
        assert report["natives"] == 1  # one native per call: not created twice
        assert report["reloadable"], "new_group returned a native group through the shim"
        assert report["sum"] == 3.0
        assert report["pg_count_destroyed"] == 1  # its communicator was freed
        assert report["reloaded"] == 1
        assert report["sum_after"] == 3.0


def _declared_layer(ctx: Rank) -> dict:
    import logging

    import reloadpg_autopatch as rpg
    from tests.support.programs import slime_like

    class Capture(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    capture = Capture()
    logging.getLogger("reloadpg_autopatch").addHandler(capture)
    dist = ctx.patched("all")
    spy = patched_ranks.NativeSpy()
    native_class = type(dist.GroupMember.WORLD)
    slime_class, slime_destroy, slime_reload = slime_like.apply()
    layer = dist.new_group
    theirs = dist.new_group([0, 1])
    report = {
        "natives": spy.created,
        "theirs": type(theirs).__name__,
        "inner_is_native": type(theirs.group) is native_class,
        "sum": total(theirs, ctx.rank + 1),
        "layer": [layer.__module__, layer.__qualname__],
    }
    rpg.destroy_process_groups()  # theirs is not ours: it stays alive
    rpg.reload_process_groups()
    report["sum_after_our_cycle"] = total(theirs, ctx.rank + 1)
    slime_destroy()
    slime_reload()
    report["sum_after_their_cycle"] = total(theirs, ctx.rank + 1)
    report["inner_is_native_after"] = type(theirs.group) is native_class
    report["is_slime_class"] = isinstance(theirs, slime_class)
    report["warnings"] = capture.messages
    return report


def test_a_layer_that_declares_it_wraps_gets_native_groups_and_a_warning() -> None:
    """slime's patch sets ``torch.distributed.old_new_group``: it owns wrapping, we step back."""
    for report in run_ranks(_declared_layer, 2, timeout=120):
        assert report["natives"] == 1
        assert report["theirs"] == "SlimeLikeGroup"
        assert report["inner_is_native"], "wrapped twice"
        assert report["is_slime_class"]
        assert report["sum"] == 3.0
        assert report["sum_after_our_cycle"] == 3.0
        assert report["sum_after_their_cycle"] == 3.0
        assert report["inner_is_native_after"]
        module, qualname = report["layer"]
        named = [m for m in report["warnings"] if module in m or qualname in m]
        assert named, f"no warning names the layer {module}.{qualname}: {report['warnings']}"


# ---- a string annotation through a dotted alias several levels deep ---------------------------


def test_p7_rule_finds_a_group_named_through_dotted_aliases() -> None:
    from reloadpg_autopatch.patching.rule import function_group_params
    from tests.support import promise_annotations as annotated

    for name in annotated.TAKE_A_GROUP:
        assert function_group_params(getattr(annotated, name)) == ("handle",), name
    assert function_group_params(annotated.not_a_group) == (), "an int is no group"


def _deep_alias_end_to_end(ctx: Rank) -> dict:
    import warnings

    import torch
    import torch.distributed as dist

    from tests.support import promise_annotations as annotated

    warnings.simplefilter("ignore", FutureWarning)
    rpg = this_tree.package()
    assert not rpg.is_patched()
    # As if a future torch had added them to its namespace: the patch derives its set from it.
    for name in (*annotated.TAKE_A_GROUP, "not_a_group"):
        setattr(dist, f"promise_{name}", getattr(annotated, name))
    rpg.monkey_patch_torch_dist()
    rpg.set_wrap_policy("all")
    ctx.init(timeout=this_tree.TIMEOUT.total_seconds())
    group = dist.new_group([0])
    out: dict[str, Any] = {"group": type(group).__name__}
    for name in annotated.TAKE_A_GROUP:
        wrapper = getattr(dist, f"promise_{name}")
        got = wrapper(torch.ones(1), handle=group)
        positional = wrapper(torch.ones(1), group)
        out[name] = {
            "wrapped": wrapper is not getattr(annotated, name),
            "keyword": type(got).__name__,
            "native": got is group.group,
            "positional": positional is group.group,
        }
    untouched = dist.promise_not_a_group
    out["not_a_group"] = {
        "wrapped": untouched is not annotated.not_a_group,
        "passes_through": untouched(torch.ones(1), handle=group) is group,
    }
    return out


def test_p7_the_generated_wrapper_unwraps_a_reloadable_group_passed_there() -> None:
    from tests.support import promise_annotations as annotated

    (report,) = run_ranks(_deep_alias_end_to_end, 1, timeout=120)
    assert report["group"] == "ReloadableProcessGroup", report
    for name in annotated.TAKE_A_GROUP:
        assert report[name] == {
            "wrapped": True,
            "keyword": "ProcessGroup",
            "native": True,
            "positional": True,
        }, (name, report[name])
    assert report["not_a_group"] == {"wrapped": False, "passes_through": True}, report


# ---- the string-annotation rule, with torch's own annotations -----------------------------

_CONTAINER_FREE = ("Optional", "Union", "Annotated")


def _receives_group(text: str) -> bool:
    """A rule of this test's own: ``ProcessGroup`` appears outside any container subscript."""
    import re

    for match in re.finditer(r"\bProcessGroup\b(?!\w)", text):
        depth, heads, i = 0, [], match.start() - 1
        while i >= 0:  # walk left, noting the head of every bracket that encloses the match
            char = text[i]
            if char == "]":
                depth += 1
            elif char == "[":
                if depth == 0:
                    head = re.search(r"([\w.]+)$", text[:i])
                    heads.append(head.group(1).rsplit(".", 1)[-1] if head else "")
                else:
                    depth -= 1
            i -= 1
        if all(h in _CONTAINER_FREE for h in heads):
            return True
    return False


def _annotation_text(func: Any, name: str, annotation: Any) -> str:
    import inspect

    raw = getattr(func, "__annotations__", {}).get(name, annotation)
    return raw if isinstance(raw, str) else inspect.formatannotation(raw)


def _annotated_names(ctx: Rank) -> dict:
    import inspect
    import types
    import warnings

    warnings.simplefilter("ignore", FutureWarning)
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    # torch 2.14.1's namespace holds no string annotation at all (checked by hand): two
    # functions of a future torch join the namespace before the patch, annotated as strings
    # (this module has ``from __future__ import annotations``) naming a TYPE_CHECKING import.
    # Their parameter is not named like a group, so only the annotation can tell.
    def _blind_probe_string(tensor: Any, grp: str | ProcessGroup | None = None) -> Any:
        return grp

    def _blind_probe_list(tensor: Any, grps: list[ProcessGroup] | None = None) -> Any:
        return grps

    for probe in (_blind_probe_string, _blind_probe_list):
        probe.__module__ = "torch.distributed"
        setattr(dist, probe.__name__, probe)
    originals = {
        name: obj for name, obj in vars(dist).items() if isinstance(obj, types.FunctionType)
    }
    in_c10d = {name for name, obj in originals.items() if getattr(c10d, name, None) is obj}
    expected = set()
    for name, func in originals.items():
        try:
            params = inspect.signature(func).parameters.values()
        except (TypeError, ValueError):
            continue
        for param in params:
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            if param.annotation is param.empty:
                continue
            if _receives_group(_annotation_text(func, param.name, param.annotation)):
                expected.add(name)
    import reloadpg_autopatch as rpg

    rpg.monkey_patch_torch_dist()  # the gate is off in this rank: patch now, after the snapshot
    patched = set(rpg.patched_names())
    return {
        "expected": sorted(expected),
        "missing": sorted(expected - patched),
        "patched": sorted(patched),
        "not_installed": sorted(
            n
            for n in expected
            if getattr(getattr(dist, n), "__wrapped__", None) is not originals[n]
        ),
        "not_in_c10d": sorted(
            n
            for n in expected & in_c10d
            if n != "_rank_not_in_group"
            and getattr(getattr(c10d, n), "__wrapped__", None) is not originals[n]
        ),
        "string_annotated": sorted(
            n
            for n in expected
            if any(
                isinstance(a, str) for a in getattr(originals[n], "__annotations__", {}).values()
            )
        ),
    }


def test_every_function_annotated_with_processgroup_is_patched() -> None:
    (report,) = run_ranks(_annotated_names, 1, env={"SLIME_RELOADABLE_PG": None})
    assert {"broadcast", "barrier", "isend", "get_rank"} <= set(report["expected"])
    assert report["string_annotated"] == ["_blind_probe_string"]
    assert "_blind_probe_list" not in report["expected"]
    assert "_blind_probe_list" not in report["patched"]  # a container never receives a group
    assert report["missing"] == []
    assert report["not_installed"] == []
    assert report["not_in_c10d"] == []


def test_the_rule_here_reads_strings_and_unions() -> None:
    assert _receives_group("ProcessGroup")
    assert _receives_group("Optional[ProcessGroup]")
    assert _receives_group("str | ProcessGroup | None")
    assert _receives_group("Union[torch.distributed.distributed_c10d.ProcessGroup, NoneType]")
    assert not _receives_group("list[ProcessGroup]")
    assert not _receives_group("Optional[list[ProcessGroup]]")
    assert not _receives_group("ProcessGroupGloo")


# ---- the rebind sweep ----------------------------------------------------------------------------


def _late_rebind(ctx: Rank) -> dict[str, Any]:
    import torch

    dist, active = gated.start(ctx)
    import reloadpg_autopatch as rpg

    rpg.set_wrap_policy("all")
    group = dist.new_group([0, 1])
    gated.reloadable(active, group)
    from tests.support import late_rebind as late  # holds torch's original when its code runs

    out = {"rebound": late.all_reduce is dist.all_reduce, "sums": []}
    for _stage in gated.stages(active):
        t = torch.tensor([ctx.rank + 1.0])
        late.all_reduce(t, group=group)
        out["sums"].append(t.item())
    return out


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "prefixes", ["tests.support.late_rebind", " megatron , tests.support.late_rebind ,"]
)
def test_rebind_sweeps_a_module_under_the_prefixes_when_it_finishes_importing(
    prefixes: str,
) -> None:
    """``SLIME_RELOADABLE_PG_REBIND`` names module prefixes to sweep; a module under them that
    is imported after start-up and holds torch's original must be swept when it finishes
    importing, so its calls reach reloadable groups through the wrapper. Any spelling the sweep
    accepts (spaces, a trailing comma) counts the same at start-up."""
    env = {**gated.ON, "SLIME_RELOADABLE_PG_REBIND": prefixes}
    for report in run_ranks(_late_rebind, 2, env=env, timeout=gated.RANK_TIMEOUT):
        assert report["rebound"], "tests.support.late_rebind.all_reduce is still torch's original"
        assert report["sums"] == [3.0] * (gated.CYCLES + 1)
