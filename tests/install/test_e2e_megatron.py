"""Megatron end to end: four installed ranks, Megatron's own groups and bound functions."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from reloadpg_autopatch.tools import launch
from reloadpg_autopatch.tools.bindings import find_bindings, takes_group
from tests.support.venv import clean_env

pytestmark = pytest.mark.timeout(400)

# The module-level bindings of group-taking torch.distributed functions in megatron-core
# 0.16.1, by (module, attribute). A newer release may add more: the ranks check all found.
KNOWN_BINDINGS = {
    ("megatron.core.distributed.param_and_grad_buffer", "_coalescing_manager"),
    ("megatron.core.distributed.param_and_grad_buffer", "dist_all_gather_func"),
    ("megatron.core.distributed.param_and_grad_buffer", "dist_reduce_scatter_func"),
    (
        "megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer",
        "_coalescing_manager",
    ),
    ("megatron.core.tensor_parallel.mappings", "dist_all_gather_func"),
    ("megatron.core.tensor_parallel.mappings", "dist_reduce_scatter_func"),
    ("megatron.core.tensor_parallel.layers", "dist_all_gather_func"),
    ("megatron.core.tensor_parallel.layers", "dist_reduce_scatter_func"),
    ("megatron.core.tensor_parallel.utils", "dist_all_gather_func"),
    ("megatron.core.timers", "dist_all_gather_func"),
    ("megatron.core.utils", "dist_all_gather_func"),
    ("megatron.core.transformer.multi_token_prediction", "dist_all_gather_func"),
}


def test_ast_scan_finds_every_known_binding_including_conditional_ones() -> None:
    found = {
        (b.module, b.attribute) for b in find_bindings("megatron.core") if takes_group(b.target)
    }
    assert found >= KNOWN_BINDINGS
    # Bindings of names that take no group (ProcessGroup, DeviceMesh) are not counted.
    assert ("megatron.core.inference.communication_utils", "ProcessGroup") not in found


def test_megatron_groups_collectives_and_three_cycles(installed, tmp_path) -> None:
    """Over 10 s: four fresh interpreters from the installed wheel, each importing torch and
    megatron-core, as the demo's ranks do; that start is what it checks."""
    expected = len(
        {(b.module, b.attribute) for b in find_bindings("megatron.core") if takes_group(b.target)}
    )
    command = [str(installed.python), "-m", "reloadpg_autopatch.tools.demo_rank", "--cycles", "3"]
    outcomes = launch.launch(
        command, 4, env=clean_env(SLIME_RELOADABLE_PG="1"), timeout=300, cwd=str(tmp_path)
    )
    for outcome in outcomes:
        assert outcome.returncode == 0
        events = {e["type"]: e for e in outcome.events if e["type"] != "cycle"}
        cycles = [e for e in outcome.events if e["type"] == "cycle"]
        ready = events["ready"]
        assert ready["activation"] == "pth"  # the installed .pth patched before Megatron loaded
        assert ready["megatron"] == version("megatron-core")
        assert ready["tp"] == 2
        assert ready["bindings"] == {"found": expected, "patched": expected}
        assert ready["groups"] >= 15  # Megatron's whole set, gloo and single-rank groups too
        assert [c["cycle"] for c in cycles] == [1, 2, 3]
        for cycle in cycles:
            assert cycle["groups"] == ready["groups"]
            assert cycle["collectives"] == ready["collectives"] >= 8
            assert cycle["bindings"] == ready["bindings"]
        assert "done" in events
