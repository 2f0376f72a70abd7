"""The patch itself, in this process on a one-rank gloo WORLD."""

from __future__ import annotations

import inspect

import pytest

import reloadpg_autopatch
from reloadpg_autopatch import _originals
from reloadpg_autopatch.patching import patchset as patch_state

pytestmark = pytest.mark.timeout(120)

# Names the issue requires on torch 2.13, beyond slime's hand-kept list of 27.
REQUIRED = {
    "all_gather_single",
    "reduce_scatter_single",
    "all_gather_into_tensor",
    "_all_gather_base",
    "_reduce_scatter_base",
    "_coalescing_manager",
    "monitored_barrier",
    "get_backend_config",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "destroy_process_group",
    "P2POp",
}


def test_every_group_taking_function_is_wrapped(patched_world) -> None:
    dist = patched_world
    from reloadpg_autopatch.patching.rule import group_params, signature_of

    names = set(reloadpg_autopatch.patched_names())
    assert names >= REQUIRED
    state = patch_state.current()
    for name, original in state.originals.items():
        if isinstance(original, type):
            continue
        signature = signature_of(original)
        takes_group = signature is not None and group_params(signature)
        assert takes_group or name in REQUIRED, name
    # Derived, not listed: everything with a group parameter in today's namespace is covered.
    for name, obj in vars(dist).items():
        if callable(obj) and not isinstance(obj, type):
            signature = signature_of(inspect.unwrap(obj))
            if signature is not None and group_params(signature):
                assert name in names, name
    public = [n for n in names if not n.startswith("_")]
    assert len(public) >= 40


def test_wrappers_keep_the_original_signature_and_wrapped(patched_world) -> None:
    dist = patched_world
    for name, wrapper in patch_state.current().wrappers.items():
        original = _originals.original(name)
        assert getattr(dist, name) is wrapper
        if isinstance(original, type):
            assert issubclass(wrapper, original)
            continue
        assert wrapper.__wrapped__ is original
        assert wrapper.__name__ == original.__name__
        assert inspect.signature(wrapper) == inspect.signature(original)


def test_second_patch_changes_nothing(patched_world) -> None:
    dist = patched_world
    before = {name: getattr(dist, name) for name in reloadpg_autopatch.patched_names()}
    state = patch_state.current()
    reloadpg_autopatch.monkey_patch_torch_dist()
    assert patch_state.current() is state
    assert {name: getattr(dist, name) for name in before} == before
    assert dist.all_reduce.__wrapped__ is state.originals["all_reduce"]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {}),  # missing required argument
        ((1, 2, 3, 4, 5), {}),  # too many positional arguments
        ((), {"tensor": None, "bogus": 1}),  # unknown keyword
        (("not a tensor",), {}),  # torch's own validation error
    ],
)
def test_wrong_arguments_raise_exactly_what_the_original_raises(
    patched_world, args, kwargs
) -> None:
    dist = patched_world
    with pytest.raises(Exception) as ours:
        dist.all_reduce(*args, **kwargs)
    with pytest.raises(Exception) as theirs:
        _originals.original("all_reduce")(*args, **kwargs)
    assert type(ours.value) is type(theirs.value)
    assert str(ours.value) == str(theirs.value)


def test_native_group_passes_through_untouched(patched_world) -> None:
    import torch

    dist = patched_world
    world = dist.GroupMember.WORLD
    assert reloadpg_autopatch.unwrap(world) is world
    t = torch.ones(3)
    dist.all_reduce(t, group=world)
    assert t.tolist() == [1.0, 1.0, 1.0]
    assert dist.get_world_size(world) == 1


@pytest.mark.parametrize("value", [None, 3, "group", 1.5, [1, 2], object()])
def test_unwrap_leaves_non_groups_alone(value) -> None:
    assert reloadpg_autopatch.unwrap(value) is value


def test_unwrap_foreign_wrappers_recursively(patched_world) -> None:
    dist = patched_world
    world = dist.GroupMember.WORLD

    class Foreign(dist.ProcessGroup):
        def __init__(self, inner):
            super().__init__(0, 1)
            self.group = inner

    class NoInner(dist.ProcessGroup):
        pass

    assert reloadpg_autopatch.unwrap(Foreign(Foreign(world))) is world
    bare = NoInner(0, 1)
    assert reloadpg_autopatch.unwrap(bare) is bare
    with pytest.raises(RuntimeError, match="destroyed"):
        reloadpg_autopatch.unwrap(Foreign(None))


def test_reloadable_group_forwards_every_process_group_member(patched_world) -> None:
    dist = patched_world
    from reloadpg_autopatch.groups.ways.wrapper.group import (
        ReloadableProcessGroup,
        forwarding_report,
    )

    report = forwarding_report()
    for name in ("all_gather_single", "reduce_scatter_single", "allreduce", "_get_backend"):
        assert name in report["methods"]
    assert "group_name" in report["properties"]
    inherited = set(report["inherited"])
    for name in report["methods"] + report["properties"]:
        assert name in ReloadableProcessGroup.__dict__, name
    # What is inherited is class data (the backend enum) and pybind11 plumbing, never a call.
    members = {n for n in dir(dist.ProcessGroup) if not n.startswith("__")}
    assert inherited == members - set(report["methods"]) - set(report["properties"])
    for name in inherited:
        raw = inspect.getattr_static(dist.ProcessGroup, name)
        assert (
            name == "_pybind11_conduit_v1_"
            or not inspect.isroutine(raw)
            or (isinstance(raw, staticmethod))
        ), name


def test_wrap_policy_rejects_unknown_values() -> None:
    with pytest.raises(ValueError, match="'auto', 'all', 'none'"):
        reloadpg_autopatch.set_wrap_policy("sometimes")


def test_rebind_prefixes_are_validated() -> None:
    from reloadpg_autopatch._startup.prefixes import parse_prefixes

    assert parse_prefixes(None) == ("megatron",)
    assert parse_prefixes(" megatron , my_pkg.sub ") == ("megatron", "my_pkg.sub")
    assert parse_prefixes(["*"]) == ("*",)
    with pytest.raises(ValueError, match="not a module name"):
        parse_prefixes("megatron; import os")
    with pytest.raises(ValueError, match="empty"):
        parse_prefixes(" , ")
    with pytest.raises(TypeError, match="module names"):
        parse_prefixes([3])


def test_rebind_redirects_identical_attributes_only(patched_world) -> None:
    import sys
    import types

    state = patch_state.current()
    fake = types.ModuleType("megatron_rebind_probe.inner")
    fake.dist_all_gather_func = state.originals["all_gather_into_tensor"]
    fake.coalescing = state.originals["_coalescing_manager"]
    fake.unrelated = len
    fake.already = state.wrappers["all_reduce"]
    other = types.ModuleType("not_swept_probe")
    other.dist_all_gather_func = state.originals["all_gather_into_tensor"]
    sys.modules[fake.__name__] = fake
    sys.modules[other.__name__] = other
    try:
        changed = reloadpg_autopatch.rebind(["megatron_rebind_probe"])
        assert sorted((c.module, c.attribute) for c in changed) == [
            ("megatron_rebind_probe.inner", "coalescing"),
            ("megatron_rebind_probe.inner", "dist_all_gather_func"),
        ]
        assert fake.dist_all_gather_func is state.wrappers["all_gather_into_tensor"]
        assert fake.unrelated is len
        assert other.dist_all_gather_func is state.originals["all_gather_into_tensor"]
        assert reloadpg_autopatch.rebind(["megatron_rebind_probe"]) == []
        stale = reloadpg_autopatch.find_stale("*")
        assert ("not_swept_probe", "dist_all_gather_func") in {
            (s.module, s.attribute) for s in stale
        }
    finally:
        del sys.modules[fake.__name__], sys.modules[other.__name__]


def test_generated_wrapper_passes_arguments_positionally_and_unwraps_the_group() -> None:
    from reloadpg_autopatch.patching.wrapgen import generate

    calls = []

    def reference(tensor, op=None, group=None, async_op=False):
        raise AssertionError("only its signature is used")

    def recorder(*args, **kwargs):
        calls.append((args, kwargs))

    class Native:
        pass

    wrapper = generate(
        reference,
        target=recorder,
        group_names=("group",),
        native_type=Native,
        unwrap=lambda g: ("unwrapped", g),
    )
    native = Native()
    wrapper(1, "sum", native)
    wrapper(2, group="foreign", async_op=True)
    assert calls == [
        ((1, "sum", native, False), {}),
        ((2, None, ("unwrapped", "foreign"), True), {}),
    ]
    assert wrapper.__wrapped__ is reference
    assert wrapper.__name__ == "reference"
