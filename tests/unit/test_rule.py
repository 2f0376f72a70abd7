"""The takes-a-group rule, against torch's own source read another way.

No ``from __future__ import annotations`` here: the synthetic signatures below must carry real
annotation objects, and strings only where a test says so.

The oracle here never calls the package's rule: it reads each function's source with ``ast``
and looks at the annotation's text, so a rule that reads spelling instead of meaning (or
misses a spelling torch adopts) disagrees with it on the installed torch.
"""

import ast
import inspect
import textwrap
import typing
from typing import Annotated, Optional, Union

import pytest

pytestmark = pytest.mark.timeout(120)

NAMED = ("group", "process_group", "pg")

# torch 2.13.0's set, pinned: the rule by meaning must change nothing there.
TORCH_2_13_PATCHED = {
    "P2POp", "_all_gather_base", "_coalescing_manager", "_get_process_group_name",
    "_rank_not_in_group", "_reduce_scatter_base", "_time_estimator", "all_gather",
    "all_gather_coalesced", "all_gather_into_tensor", "all_gather_object", "all_gather_single",
    "all_reduce", "all_reduce_coalesced", "all_to_all", "all_to_all_single", "barrier",
    "broadcast", "broadcast_object_list", "destroy_process_group", "gather", "gather_object",
    "get_backend", "get_backend_config", "get_global_rank", "get_group_rank",
    "get_process_group_ranks", "get_rank", "get_world_size", "irecv", "isend",
    "monitored_barrier", "new_group", "new_subgroups", "new_subgroups_by_enumeration", "recv",
    "recv_object_list", "reduce", "reduce_scatter", "reduce_scatter_single",
    "reduce_scatter_tensor", "scatter", "scatter_object_list", "send", "send_object_list",
    "shrink_group", "split_group",
}  # fmt: skip

# The functions torch 2.14.1 annotates with unions, which a spelling rule left unwrapped.
TORCH_2_14_UNIONS = {"all_gather", "all_gather_single", "_rank_not_in_group", "get_backend_impl"}

_CONTAINERS = ("list[", "List[", "Sequence[", "tuple[", "Tuple[", "dict[", "Dict[", "Iterable[")


def _oracle_takes_group(arg: ast.arg) -> bool:
    """An independent reading: the annotation's source text names ProcessGroup outside a
    container, or the parameter is unannotated and named like a group."""
    if arg.annotation is None:
        return arg.arg in NAMED or arg.arg.endswith("_pg")
    text = ast.unparse(arg.annotation).replace(" ", "").strip("'\"")
    if text.startswith(_CONTAINERS):
        return False
    tokens = [t for t in "".join(c if c.isalnum() or c in "._" else " " for c in text).split()]
    return any(t.rsplit(".", 1)[-1] == "ProcessGroup" for t in tokens)


def _source_params(func: object) -> list[ast.arg] | None:
    target = inspect.unwrap(func)
    try:
        source = textwrap.dedent(inspect.getsource(target))
    except (OSError, TypeError):
        return None
    node = ast.parse(source).body[0]
    if not isinstance(node, ast.FunctionDef):
        return None
    args = node.args
    return [*args.posonlyargs, *args.args, *args.kwonlyargs]


@pytest.fixture(scope="module")
def torch_names(patched_world):
    from reloadpg_autopatch import _originals
    from reloadpg_autopatch.patching import patchset as state

    return _originals.snapshot()["namespace"], set(state.patched_names())


def test_every_function_whose_source_takes_a_group_is_wrapped(torch_names) -> None:
    snapshot, patched = torch_names
    expected = set()
    for name, obj in snapshot.items():
        if isinstance(obj, type) or not inspect.isfunction(inspect.unwrap(obj)):
            continue
        params = _source_params(obj)
        if params and any(_oracle_takes_group(p) for p in params):
            expected.add(name)
    assert expected, "the oracle found nothing: it cannot fail"
    assert expected - patched == set()
    # Whatever else is patched is a factory or a class: new_group and the helpers around it.
    extra = {n for n in patched - expected if not isinstance(snapshot[n], type)}
    assert extra <= {"new_group", "new_subgroups", "new_subgroups_by_enumeration"}, extra


def test_this_torch_gets_what_its_release_needs(torch_names) -> None:
    import torch

    _, patched = torch_names
    version = torch.__version__.split("+")[0]
    if version == "2.13.0":
        assert patched == TORCH_2_13_PATCHED
    elif version == "2.14.1":
        assert patched >= TORCH_2_14_UNIONS | TORCH_2_13_PATCHED
    else:
        pytest.skip(f"no pinned expectation for torch {torch.__version__}")


def _params(func: object) -> tuple[str, ...]:
    from reloadpg_autopatch.patching.rule import function_group_params

    return function_group_params(func)


def test_unions_at_any_depth_strings_and_names(patched_world) -> None:
    dist = patched_world
    pg = dist.ProcessGroup

    class Sub(pg):
        pass

    def annotated(  # noqa: PLR0917 - one parameter per spelling
        a: pg,
        b: pg | None,
        c: Optional[pg],  # noqa: UP045 - the spelling is what is tested
        d: Union[int, Union[str, pg]],
        e: "ProcessGroup | C10DBackend | None",  # noqa: F821 - a name only type checkers see
        f: "Optional[dist.ProcessGroup]",  # noqa: UP045
        g: Annotated[pg | None, "meta"],
        h: Sub,
        i: typing.ForwardRef("ProcessGroup"),
        j: "str | ProcessGroup | None",  # noqa: F821
    ) -> None: ...

    def not_groups(  # noqa: PLR0917 - one parameter per case
        group_src: int,
        group_desc: str,
        wrapped_pg: dist.Backend,
        groups: list[pg],
        seq: "list[ProcessGroup]",  # noqa: F821
        anything: object,
        tensor=None,
        *args,
        **kwargs,
    ) -> None: ...

    def unannotated(group=None, process_group=None, pg=None, parent_pg=None, grp=None) -> None: ...

    assert _params(annotated) == tuple("abcdefghij")
    assert _params(not_groups) == ()
    assert _params(unannotated) == ("group", "process_group", "pg", "parent_pg")


def test_string_annotations_resolve_in_the_functions_own_module(patched_world) -> None:
    namespace: dict = {}
    exec(  # noqa: S102 - a module with postponed annotations, as torch's own files can be
        "from __future__ import annotations\n"
        "import torch.distributed as d\n"
        "Alias = d.ProcessGroup\n"
        "def f(x: Alias | None, y: d.Store | None, z: 'Alias') -> None: ...\n",
        namespace,
    )
    assert _params(namespace["f"]) == ("x", "z")
