"""What the documentation promises that a test can keep.

The README's cycle sample runs; docs/api.md has a section for every public name, whose code
block shows the parameters the code has; every relative link in the docs resolves, and no doc
refers to a file outside the repository.

The sample is the block after the ``<!-- cycle-sample ... -->`` marker in README.md. It runs on
two gloo ranks that the gate alone activates (``SLIME_RELOADABLE_PG=1``; each rank a freshly
spawned interpreter, as a user's are, where the package's ``.pth`` applies the patch). What a
CPU machine cannot run is changed in the sample's text, each change asserted to apply exactly
once, so an edited sample fails here rather than running something else:

- ``init_process_group("nccl")`` becomes ``init_process_group("gloo")``;
- ``register_default_process_group()`` is given ``accelerator_backends=("gloo",)``, so that
  gloo plays the accelerator and WORLD goes through the swap it takes on NCCL.

The rendezvous is the one the sample's ``init_process_group`` already uses, ``env://``: each
rank sets the variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``, and ``TORCHELASTIC_USE_AGENT_STORE``, because the test's
parent hosts the store as torchrun's agent does). The names the sample leaves to the user
(``build_model``, ``train_step``, ``rollout``, ``num_rollouts``) are the test's, and they hold
its oracle: hand-computed results of collectives on Megatron's TP group and on WORLD, through
``torch.distributed`` and through a function Megatron bound at import time, before the first
cycle and after each reload; the same group objects and the same ``dist.group.WORLD`` every
time; and during each rollout, a collective on the TP group that must raise.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.ranks import Rank, run_ranks

README = ROOT / "README.md"
MARKER = "<!-- cycle-sample"
NUM_ROLLOUTS = 2

#: (exact text in the sample, what runs instead on CPU): each must occur exactly once.
SUBSTITUTIONS = (
    ('dist.init_process_group("nccl")', 'dist.init_process_group("gloo")'),
    (
        "reloadpg_autopatch.register_default_process_group()",
        'reloadpg_autopatch.register_default_process_group(accelerator_backends=("gloo",))',
    ),
)


def cycle_sample(text: str) -> str:
    """The Python block that follows the README's one cycle-sample marker."""
    lines = text.splitlines()
    markers = [i for i, line in enumerate(lines) if line.strip().startswith(MARKER)]
    assert len(markers) == 1, f"README.md has {len(markers)} '{MARKER}' markers, want 1"
    fence = markers[0] + 1
    assert lines[fence].strip() == "```python", "the cycle-sample marker must precede ```python"
    end = next(i for i in range(fence + 1, len(lines)) if lines[i].strip() == "```")
    return "\n".join(lines[fence + 1 : end]) + "\n"


def on_cpu(sample: str) -> str:
    for text, replacement in SUBSTITUTIONS:
        count = sample.count(text)
        assert count == 1, f"the README's sample has {text!r} {count} times, want exactly once"
        sample = sample.replace(text, replacement)
    return sample


# ---- rank side ----------------------------------------------------------------------------


def _run_sample(ctx: Rank, source: str) -> dict[str, Any]:
    import os
    import types
    import warnings

    warnings.simplefilter("ignore", FutureWarning)
    warnings.simplefilter("ignore", UserWarning)  # Megatron without Apex
    os.environ.update(
        RANK=str(ctx.rank),
        LOCAL_RANK=str(ctx.rank),
        WORLD_SIZE=str(ctx.world_size),
        MASTER_ADDR=ctx.host,
        MASTER_PORT=str(ctx.port),
        TORCHELASTIC_USE_AGENT_STORE="True",  # the parent hosts the store, as torchrun's agent
    )
    import torch

    seen: dict[str, Any] = {"trained": [], "rollout_errors": []}
    everyone = float(sum(range(1, ctx.world_size + 1)))

    def expect(what: str, got: Any, want: Any) -> None:
        if got != want:
            raise AssertionError(f"{what}: got {got!r}, want {want!r}")

    def build_model() -> Any:
        import torch.distributed as dist
        from megatron.core import parallel_state

        return types.SimpleNamespace(
            tp=parallel_state.get_tensor_model_parallel_group(), world=dist.group.WORLD
        )

    def train_step(model: Any) -> None:
        import torch.distributed as dist
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel import mappings

        label = f"train step {len(seen['trained']) + 1}"
        if parallel_state.get_tensor_model_parallel_group() is not model.tp:
            raise AssertionError(f"{label}: Megatron's TP group is another object")
        if dist.group.WORLD is not model.world:
            raise AssertionError(f"{label}: dist.group.WORLD is another object")
        mine = torch.tensor([float(ctx.rank + 1)])
        on_tp = mine.clone()
        dist.all_reduce(on_tp, group=model.tp)
        expect(f"{label}: all_reduce on the TP group", on_tp.item(), everyone)
        on_world = mine.clone()
        dist.all_reduce(on_world)
        expect(f"{label}: all_reduce on WORLD", on_world.item(), everyone)
        # Bound by Megatron when it was imported: the binding a late patch misses.
        gathered = torch.zeros(ctx.world_size)
        mappings.dist_all_gather_func(gathered, torch.tensor([float(ctx.rank)]), group=model.tp)
        expect(f"{label}: Megatron's dist_all_gather_func", gathered.tolist(), [0.0, 1.0])
        seen["trained"].append(label)

    def rollout(model: Any) -> None:
        import torch.distributed as dist

        try:
            dist.all_reduce(torch.ones(1), group=model.tp)
        except RuntimeError as error:
            seen["rollout_errors"].append(str(error))
        else:
            raise AssertionError("a collective on the TP group worked between destroy and reload")

    namespace = {
        "__name__": "readme_cycle_sample",
        "build_model": build_model,
        "train_step": train_step,
        "rollout": rollout,
        "num_rollouts": NUM_ROLLOUTS,
    }
    exec(compile(source, "README.md (cycle sample)", "exec"), namespace)  # noqa: S102

    import torch.distributed as dist

    train_step(namespace["model"])  # after the last reload
    return {
        "patched": hasattr(dist.all_reduce, "__reloadpg_autopatch__"),
        "trained": len(seen["trained"]),
        "rollout_errors": seen["rollout_errors"],
    }


# ---- tests --------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_the_readme_cycle_sample_runs_on_gloo_ranks() -> None:
    """The sample as a user runs it: each rank a freshly spawned interpreter (``fresh=True``,
    not forked from a warm parent) that the ``.pth`` activates at its start, where it imports
    megatron itself. Over 10 s on the torch 2.14.1 lane: two interpreters import torch and
    megatron-core from nothing, which is the point of this test."""
    pytest.importorskip("megatron.core", reason="the README's sample builds Megatron's groups")
    source = on_cpu(cycle_sample(README.read_text(encoding="utf-8")))
    run = functools.partial(_run_sample, source=source)
    results = run_ranks(run, 2, env={"SLIME_RELOADABLE_PG": "1"}, timeout=240, fresh=True)
    for rank, result in enumerate(results):
        assert result["patched"], f"rank {rank}: the gate did not patch torch.distributed"
        assert result["trained"] == NUM_ROLLOUTS + 1, (rank, result)
        errors = result["rollout_errors"]
        assert len(errors) == NUM_ROLLOUTS, (rank, result)
        assert all("reload_process_groups()" in error for error in errors), (rank, errors)


def test_the_sample_makes_the_cycle_calls_in_order_each_marked_on_every_rank() -> None:
    sample = cycle_sample(README.read_text(encoding="utf-8"))
    calls = re.findall(r"reloadpg_autopatch\.(\w+)\(", sample)
    assert calls == [
        "register_default_process_group",
        "destroy_process_groups",
        "reload_process_groups",
    ]
    statements = [
        line.strip()
        for line in sample.splitlines()
        if line.strip() and not line.strip().startswith(("import ", "from ", "for ", "#"))
    ]
    unmarked = [line for line in statements if "# on every rank" not in line]
    assert not unmarked, f"calls in the sample not marked '# on every rank': {unmarked}"
    on_cpu(sample)  # every substitution applies exactly once


# ---- the API reference ---------------------------------------------------------------------

API = ROOT / "docs" / "api.md"
#: Constructed by the package, not by users: their sections show attributes, not a constructor.
#: Names a program catches or receives but does not build: their sections show the class only.
NOT_CONSTRUCTED = {"ReloadHookHandle", "ReloadHookError"}
NOT_CONSTRUCTED |= {
    n for n in __import__("reloadpg_autopatch.errors").errors.__all__ if n[0].isupper()
}


def _documented_signatures() -> dict[str, list[str]]:
    """Each ``### `name` `` section of docs/api.md: the parameter names its code block shows."""
    import ast

    text = API.read_text(encoding="utf-8")
    found: dict[str, list[str]] = {}
    for match in re.finditer(r"^#{2,3} `(\w+)`\n\n```python\n(.*?)\n```", text, re.M | re.S):
        name, code = match.groups()
        node = next(
            (n for n in ast.parse(code).body if getattr(n, "name", None) == name),
            None,
        )
        if isinstance(node, ast.FunctionDef):
            args = node.args
            found[name] = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
        elif isinstance(node, ast.ClassDef):
            init = next(
                (n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
                None,
            )
            if init is not None:
                found[name] = [a.arg for a in init.args.args[1:] + init.args.kwonlyargs]
            else:
                found[name] = [
                    n.target.id
                    for n in node.body
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                ]
        else:
            found[name] = []
    return found


def test_the_api_reference_has_a_section_per_public_name_with_its_signature() -> None:
    pytest.importorskip("torch")
    import inspect

    import reloadpg_autopatch

    documented = _documented_signatures()
    names = [*reloadpg_autopatch._EXPORTS, "__version__"]
    assert sorted(documented) == sorted(names), "docs/api.md's sections and _EXPORTS differ"
    wrong = {}
    for name in reloadpg_autopatch._EXPORTS:
        if name in NOT_CONSTRUCTED:
            continue
        parameters = inspect.signature(getattr(reloadpg_autopatch, name)).parameters
        actual = [p for p in parameters if not p.startswith("_")]
        if documented[name] != actual:
            wrong[name] = (documented[name], actual)
    assert not wrong, f"docs/api.md (documented, actual): {wrong}"


# ---- links --------------------------------------------------------------------------------

DOCS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md"])
DOCS += sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    anchors: set[str] = set()
    counts: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_the_docs_exist() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in DOCS}
    assert {"README.md", "CONTRIBUTING.md", "CHANGELOG.md", "docs/api.md"} <= names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_at_a_file_that_exists(doc: Path) -> None:
    broken = []
    for target in LINK.findall(_prose(doc.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif not resolved.is_relative_to(ROOT):
            broken.append(f"{target} (outside the repository)")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target} (no heading with that anchor)")
    assert not broken, f"{doc.name}: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_doc_refers_to_files_outside_the_repository(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    for word in ("shared/", "seed-pr", "background/"):
        assert word not in text, f"{doc.name} mentions {word!r}, which is not in the repository"
