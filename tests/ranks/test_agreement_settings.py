"""A refusal is agreed before anything diverges (issue 38, items 1 and 2).

What decides a refusal (the mode, NCCL's variables, whether a framework's lifecycle is adopted)
differs on one rank; every rank must raise the same error naming each setting that differs with
its ranks, at the world's first registration or group creation, within WORLD's timeout, before
any rank creates a group its peers do not.

NCCL cannot run on CPU: as in ``tests/ranks/test_agreement_disagreeing_ranks.py``, the
suspendable stand-in (``reloadpg_autopatch/tools/cpu_nccl``) is registered for an accelerator
device only (``tests/support/accelerator.py``), so that ``NCCL_CUMEM_ENABLE=0`` makes suspend
refuse it as it refuses NCCL. The slime-shaped actor is ``tests/support/frameworks`` (written
for the project). Each rank's own environment is set in the rank before the package reads it,
as a node's would be.

The oracles are outside the package: the exception each rank raises and when (the clock: a rank
that hangs fails the run's deadline), the exit status of a rank started with the gate off, and
torch's collective results where the ranks agree.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.support import PROGRAMS, ROOT, accelerator
from tests.support.ranks import GATE, Rank, run_ranks, total
from tests.support.venv import clean_env

pytestmark = pytest.mark.timeout(240)

#: WORLD's timeout here: a rank that waits for a peer's creation waits this long at least.
WORLD_S = 20.0
#: What every rank must learn within: far below WORLD's timeout (the round is one round trip).
PROMPT_S = 5.0
#: The run's deadline: before the fix, ranks hang in torch's creation (30 minutes on gloo).
DEADLINE_S = 60.0


def _begin(ctx: Rank, mode: str, env: dict[str, str], world: str = "gloo") -> tuple[Any, Any]:
    """This rank's environment (as its node sets it), the stand-ins, WORLD; (dist, rpg)."""
    import warnings

    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.tools import cpu_nccl as s

    warnings.simplefilter("ignore", FutureWarning)
    os.environ.update(env)
    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    s.register()
    dist.Backend.register_backend(accelerator.ACCEL, accelerator.create, devices=[s.ACCELERATOR])
    os.environ["SLIME_RELOADABLE_PG_MODE"] = mode
    rpg.set_memory_probe(s.memory_probe, device_types=("cpu", s.ACCELERATOR))
    rpg.set_memory_guard(0.0)
    ctx.init(backend=world, timeout=WORLD_S)
    return dist, rpg


def _outcome(call: Any) -> dict[str, Any]:
    started = time.monotonic()
    try:
        call()
        error = None
    except Exception as caught:
        error = caught
    return {
        "error": None if error is None else type(error).__name__,
        "message": "" if error is None else str(error),
        "seconds": time.monotonic() - started,
    }


# ---- item 1: NCCL_CUMEM_ENABLE=0 on one rank in suspend mode ---------------------------------


def _registered_then_megatron(ctx: Rank, odd: int) -> dict[str, Any]:
    """slime's order: WORLD (on the stand-in, so it sleeps by suspend) registered, then
    Megatron's groups. Rank ``odd`` has ``NCCL_CUMEM_ENABLE=0``."""
    env = {"NCCL_CUMEM_ENABLE": "0"} if ctx.rank == odd else {}
    dist, rpg = _begin(ctx, "suspend", env, world=accelerator.MIXED)
    out = _outcome(rpg.register_default_process_group)
    if out["error"] is None:  # Megatron's groups: a rank that refused never gets here
        out["megatron"] = _outcome(
            lambda: [dist.new_group([r], backend=accelerator.MIXED) for r in range(ctx.world_size)]
        )
    return out


def test_a_refusal_at_registration_is_every_ranks_and_names_the_variable() -> None:
    """Suspend mode, ``NCCL_CUMEM_ENABLE=0`` on rank 2 of 3, WORLD registered first (slime's
    order): every rank raises ``ModeRefusedError`` at registration within ``PROMPT_S`` naming
    ``NCCL_CUMEM_ENABLE=0 on ranks 2``; before, rank 2 alone refused and the others blocked in
    Megatron's next ``new_group``."""
    reports = run_ranks(
        functools.partial(_registered_then_megatron, odd=2), 3, timeout=DEADLINE_S, env=GATE
    )
    for rank, out in enumerate(reports):
        assert out["error"] == "ModeRefusedError", (rank, out)
        assert out["seconds"] < PROMPT_S, (rank, out)
        assert "NCCL_CUMEM_ENABLE=0 on ranks 2" in out["message"], (rank, out)
        assert "NCCL_CUMEM_ENABLE unset on ranks 0, 1" in out["message"], (rank, out)
        assert "register_default_process_group()" in out["message"], (rank, out)


def _first_creation(ctx: Rank, modes: list[str], env: dict[int, dict[str, str]]) -> dict:
    """No registration: the ranks' first ``new_group`` (a stand-in group over every rank),
    each rank in ``modes[rank]`` with ``env[rank]``; then a collective on WORLD."""
    dist, _rpg = _begin(ctx, modes[ctx.rank], env.get(ctx.rank, {}))
    out = _outcome(lambda: dist.new_group(list(range(ctx.world_size)), backend=accelerator.MIXED))
    out["again"] = _outcome(lambda: dist.new_group([0, 1], backend=accelerator.MIXED))
    out["world"] = total(None, ctx.rank + 1)  # WORLD itself is untouched: every rank is here
    return out


FIRST_CREATION = {
    "cumem": (["suspend"] * 3, {1: {"NCCL_CUMEM_ENABLE": "0"}}, ["NCCL_CUMEM_ENABLE=0 on ranks 1"]),
    "mode": (
        ["suspend", "suspend", "wrapper"],
        {},
        ["SLIME_RELOADABLE_PG_MODE=wrapper on ranks 2", "=suspend on ranks 0, 1"],
    ),
    "native beside wrapper": (
        ["native", "wrapper", "wrapper"],
        {},
        ["SLIME_RELOADABLE_PG_MODE=native on ranks 0"],
    ),
    "two variables": (
        ["suspend"] * 3,
        {0: {"NCCL_DISABLE_MEM_MANAGER": "1"}, 2: {"NCCL_CUMEM_ENABLE": "0"}},
        ["NCCL_DISABLE_MEM_MANAGER=1 on ranks 0", "NCCL_CUMEM_ENABLE=0 on ranks 2"],
    ),
}


@pytest.mark.parametrize("case", sorted(FIRST_CREATION))
def test_a_refusal_at_the_first_creation_is_every_ranks(case: str) -> None:
    """No WORLD registered: the first ``new_group`` raises ``ModeRefusedError`` on every rank
    within ``PROMPT_S``, naming each setting that differs with its values and ranks (before, a
    rank refused alone and its peers' first collective on the group failed, or they refused
    nothing until the destroy); a second ``new_group`` raises it again at once, with no round;
    WORLD still works on every rank (its sum is every rank's)."""
    modes, env, expected = FIRST_CREATION[case]
    body = functools.partial(_first_creation, modes=modes, env=env)
    for rank, out in enumerate(run_ranks(body, 3, timeout=DEADLINE_S, env=GATE)):
        assert out["error"] == "ModeRefusedError", (rank, out)
        assert out["seconds"] < PROMPT_S, (rank, out)
        for words in expected:
            assert words in out["message"], (rank, words, out["message"])
        assert out["again"]["error"] == "ModeRefusedError", (rank, out["again"])
        assert out["again"]["message"] == out["message"], (rank, out["again"])
        assert out["again"]["seconds"] < 0.5, (rank, out["again"])
        assert out["world"] == 6.0, (rank, out)


def _reconciled_later(ctx: Rank) -> dict[str, Any]:
    env = {"NCCL_CUMEM_ENABLE": "0"} if ctx.rank == 1 else {}
    dist, rpg = _begin(ctx, "auto" if ctx.rank == 0 else "wrapper", env)
    group = dist.new_group([0, 1, 2])
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    return {"sum": total(group, ctx.rank + 1)}


def test_settings_that_differ_only_where_the_destroy_reconciles_them_refuse_nothing() -> None:
    """``auto`` on rank 0 beside ``wrapper``, and ``NCCL_CUMEM_ENABLE=0`` on rank 1 outside
    suspend mode: no creation diverges, so nothing is refused; the group works after a cycle."""
    reports = run_ranks(_reconciled_later, 3, timeout=DEADLINE_S, env=GATE)
    assert [r["sum"] for r in reports] == [6.0] * 3


# ---- item 2: adoption on some ranks only ------------------------------------------------------


def _slime_with_adoption_off_on(ctx: Rank, off: int) -> dict[str, Any]:
    """The slime-shaped actor on every rank, ``SLIME_RELOADABLE_PG_ADOPT=0`` on rank ``off``
    only, WORLD on an accelerator-like backend (swapped on destroy: the adopting ranks'
    registration would remake slime's Gloo group, one creation more than rank ``off`` makes)."""
    from tests.support import actors, frameworks

    if ctx.rank == off:
        os.environ["SLIME_RELOADABLE_PG_ADOPT"] = "0"
    frameworks.on_path()
    backend = actors.accelerator_world()
    from slime.backends.megatron_utils import actor as actor_module

    args = actors.args(ctx, backend)
    args.distributed_timeout_minutes = WORLD_S / 60
    actor = actor_module.MegatronTrainRayActor()
    return _outcome(lambda: actor.init(args))


def test_adoption_on_some_ranks_only_is_refused_on_every_rank_at_once() -> None:
    """``SLIME_RELOADABLE_PG_ADOPT=0`` on rank 2 of 3: every rank raises ``ModeRefusedError``
    at the actor's first group creation, within ``PROMPT_S``, naming
    ``SLIME_RELOADABLE_PG_ADOPT=off on ranks 2``; before, ranks 0 and 1 blocked in a
    ``new_group`` that rank 2 never made."""
    body = functools.partial(_slime_with_adoption_off_on, off=2)
    reports = run_ranks(body, 3, timeout=DEADLINE_S, env=GATE, store_in_rank0=True)
    for rank, out in enumerate(reports):
        assert out["error"] == "ModeRefusedError", (rank, out)
        assert out["seconds"] < PROMPT_S, (rank, out)
        assert "SLIME_RELOADABLE_PG_ADOPT=off on ranks 2" in out["message"], (rank, out)
        assert "SLIME_RELOADABLE_PG_ADOPT=on on ranks 0, 1" in out["message"], (rank, out)
        assert "new_group()" in out["message"], (rank, out)


#: WORLD's timeout of the job with the gate off on one rank: what its peers wait for it.
GATE_OFF_WORLD_S = 3.0


@pytest.mark.timeout(120)
def test_the_gate_off_on_one_rank_is_named_by_its_peers_within_worlds_timeout(tmp_path) -> None:
    """Three fresh interpreters (the subject is start-up: the gate differs per rank, which a
    warm parent cannot give; about 10 s), each running the slime-shaped actor; rank 2 without
    the gate. Ranks 0 and 1 raise ``PeerMissingError`` at the actor's first group creation
    within WORLD's timeout (3 s) plus a few seconds, naming rank 2 and the gate; before, they
    went on with one creation more than rank 2 and blocked, or failed naming no variable. Rank
    2, where the package is not active, cannot say anything: it ends once the store's host
    (rank 0) has left."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    procs = []
    for rank in range(3):
        env = clean_env(PYTHONPATH=str(ROOT), **(GATE if rank != 2 else {}))
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(PROGRAMS / "slime_rank.py"),
                    str(rank),
                    "3",
                    str(port),
                    str(GATE_OFF_WORLD_S),
                ],
                env=env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        outs = [proc.communicate(timeout=90) for proc in procs[:2]]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    for rank, (stdout, stderr) in enumerate(outs):
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        assert lines, (rank, stdout[-2000:], stderr[-3000:])
        out = json.loads(lines[-1])
        assert out["patched"], out
        assert out["error"] == "PeerMissingError", (rank, out)
        assert out["missing"] == [2], (rank, out)
        assert "SLIME_RELOADABLE_PG" in out["message"], (rank, out)
        assert out["seconds"] < GATE_OFF_WORLD_S + 8, (rank, out)
