"""Ranks that disagree, and an agreed outcome that must reach every rank (issue 33, items 1-2).

No GPU exists here, and NCCL cannot run on CPU: the suspendable backend is the stand-in of
``reloadpg_autopatch/tools/cpu_nccl`` (NCCL's suspend protocol on gloo). For the environment's
refusal (``NCCL_CUMEM_ENABLE=0``) to be reached at all, the stand-in is also registered for an
accelerator device type only (``ACCEL``, on ``privateuseone``), as NCCL is for ``cuda``, and the
groups are mixed (``cpu:gloo,privateuseone:ACCEL``) so that their CPU collectives run on gloo.

The oracles are outside the package: the exception each rank raises and when (the clock), the
stand-in's call log (whether any suspend reached a backend), torch's collective results, and a
rank process that ends itself with ``os._exit`` while hosting the store.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

import pytest

from reloadpg_autopatch.tools import cpu_nccl as suspendable
from tests.support import accelerator
from tests.support.ranks import GATE, Rank, run_ranks

pytestmark = pytest.mark.timeout(240)

#: torch 2.14 (pre-hooks: the program holds torch's own group in suspend and auto modes).
ON_214 = suspendable.python_backend_available()
#: How long rank 1 waits before it reads a round's verdict.
DELAY_S = 1.0


def _start(ctx: Rank, mode: str, *, timeout: float = 30.0) -> tuple[Any, Any, Any]:
    """Join a gloo WORLD in ``mode`` with both stand-ins registered; (dist, rpg, s)."""
    import warnings

    import torch.distributed as dist

    import reloadpg_autopatch as rpg
    from reloadpg_autopatch.tools import cpu_nccl as s

    warnings.simplefilter("ignore", FutureWarning)
    assert rpg.is_patched(), "the gate did not patch this rank at start-up"
    s.register()
    dist.Backend.register_backend(accelerator.ACCEL, accelerator.create, devices=[s.ACCELERATOR])
    rpg.set_reload_mode(mode)
    rpg.set_memory_probe(s.memory_probe, device_types=("cpu", s.ACCELERATOR))
    rpg.set_memory_guard(0.0)
    ctx.init(timeout=timeout)
    return dist, rpg, s


def _outcome(call: Any) -> tuple[str, str]:
    try:
        call()
        return ("ok", "")
    except Exception as error:
        return (type(error).__name__, str(error))


# ---- item 2: the store's host leaves right after an agreed refusal ---------------------------


def _host_leaves(ctx: Rank, case: str, mark: str) -> tuple[str, str, Any]:
    """``case`` ``refused``: suspend mode, and rank 1's backend of ``tp`` stops supporting
    suspend, so the destroy's agreement refuses on every rank. ``short``: suspend mode, ``tp``
    sleeps, then rank 1's pretend device fills up, so the reload's agreement refuses on every
    rank (``MemoryShortError``). ``none``: wrapper mode and no group, so the destroy's
    agreement is its one store round and nothing waits after it. Rank 1 reads the round's
    result ``DELAY_S`` late; rank 0, which hosts the store, ends its process the moment its
    step returns or raises, after writing to ``mark`` how long the step took. Returns (error
    class name, text, ``missing`` of a ``PeerMissingError``)."""
    import torch

    from reloadpg_autopatch.groups.store import entries

    dist, rpg, s = _start(ctx, "wrapper" if case == "none" else "suspend")
    step = rpg.destroy_process_groups
    if case != "none":
        tp = dist.new_group([0, 1], backend=s.NAME_A, group_desc="tp")
    if case == "short":
        rpg.destroy_process_groups()
        step = rpg.reload_process_groups
    if ctx.rank == 1:
        if case == "refused":
            tp._get_backend(torch.device("cpu")).settings.unsupported = "backend"
        if case == "short":
            s.occupy(s.device_memory()[0])  # not a byte left to resume into
        read = entries.read

        def late(store: Any, key: str) -> bytes:
            if key.endswith("/done"):
                time.sleep(DELAY_S)
            return read(store, key)

        entries.read = late
    started = time.monotonic()
    try:
        step()
        outcome: tuple[str, str, Any] = ("ok", "", None)
    except Exception as error:
        outcome = (type(error).__name__, str(error), getattr(error, "missing", None))
    if ctx.store_host:
        Path(mark).write_text(str(time.monotonic() - started))
        os._exit(0)  # at once, as an uncaught exception ends a process
    return outcome


def _run_host_leaves(case: str, mark: Path) -> tuple[str, str, Any]:
    reports = run_ranks(
        functools.partial(_host_leaves, case=case, mark=str(mark)),
        2,
        timeout=60,
        env={**GATE, "SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT": "20"},
        store_in_rank0=True,
        may_die=frozenset({0}),
    )
    return reports[1]


@pytest.mark.parametrize("attempt", range(3))
def test_an_agreed_refusal_reaches_a_late_peer_after_the_store_host_exits(
    attempt: int, tmp_path: Path
) -> None:
    """The store's host (rank 0) raises the agreed ``ModeRefusedError`` and exits at once; rank
    1, which reads the verdict a second later, still gets that refusal, not a
    ``PeerMissingError`` blaming the host (three runs: it is not a matter of luck). The host
    waited for that read only, not for WORLD's timeout (30 s)."""
    mark = tmp_path / "host seconds"
    kind, text, _missing = _run_host_leaves("refused", mark)
    assert kind == "ModeRefusedError", (kind, text)
    assert "cannot be suspended on every member" in text, text
    assert float(mark.read_text()) < DELAY_S + 5, mark.read_text()


def test_a_memory_refusal_at_reload_reaches_a_late_peer_after_the_store_host_exits(
    tmp_path: Path,
) -> None:
    """The same at the reload's agreement: rank 1 is short of memory to resume, every rank
    raises ``MemoryShortError``, and rank 1 still gets it, a second late, once the host (rank
    0) has raised it and exited."""
    mark = tmp_path / "host seconds"
    kind, text, _missing = _run_host_leaves("short", mark)
    assert kind == "MemoryShortError", (kind, text)
    assert "rank 1 " in text, text
    assert float(mark.read_text()) < DELAY_S + 5, mark.read_text()


def test_a_peer_that_finds_the_store_gone_says_its_host_left_and_blames_no_rank(
    tmp_path: Path,
) -> None:
    """No error agreed: the host (rank 0) leaves right after a destroy that worked (one store
    round, nothing after it), before rank 1 has read the round's result. Rank 1's
    ``PeerMissingError`` says the store's host left after rank 1 arrived, and names no missing
    rank."""
    kind, text, missing = _run_host_leaves("none", tmp_path / "host seconds")
    assert kind == "PeerMissingError", (kind, text)
    assert "its host" in text, text
    assert "left after this rank had arrived" in text, text
    assert missing == [], missing


#: What a rank that disagrees must learn within (the watchdog's timeout below is far longer).
PROMPT_S = 5.0
#: The watchdog's timeout in these ranks: a rank alone in a suspend barrier ends this late.
WATCHDOG_S = "12"


def _disagree(
    ctx: Rank, modes: tuple[str, str], cumem: tuple[str, str], use: bool = True
) -> dict[str, Any]:
    """Rank r runs in ``modes[r]`` with ``NCCL_CUMEM_ENABLE=cumem[r]`` ("" : unset); one mixed
    group ``tp`` over both ranks, then one cycle and (``use``: where every rank has it) a
    collective on ``tp``. The settings change after the world's first creation (the settings
    that differ from the start are refused there on every rank,
    ``tests/ranks/test_agreement_settings.py``): it is the destroy's agreement that finds these."""
    from tests.support.ranks import total

    dist, rpg, s = _start(ctx, "wrapper")
    dist.new_group([0, 1])  # the world's first creation: every rank's settings alike
    if cumem[ctx.rank]:
        os.environ["NCCL_CUMEM_ENABLE"] = cumem[ctx.rank]
    rpg.set_reload_mode(modes[ctx.rank])
    out: dict[str, Any] = {}
    try:
        tp = dist.new_group([0, 1], backend=accelerator.MIXED, group_desc="tp")
        out["create"] = ("ok", "")
        out["name"] = str(tp.group_name)
    except Exception as error:
        tp = None
        out["create"] = (type(error).__name__, str(error))
    started = time.monotonic()
    out["destroy"] = _outcome(rpg.destroy_process_groups)
    out["destroy s"] = time.monotonic() - started
    out["report"] = rpg.last_cycle_report().to_dict()["destroy"]["groups"]
    out["reload"] = _outcome(rpg.reload_process_groups)
    out["lifecycle calls"] = [(c.op, c.outcome) for c in s.CALLS if c.op in ("suspend", "resume")]
    out["sum"] = total(tp, ctx.rank + 1) if use else None
    return out


def _run_disagree(
    modes: tuple[str, str], cumem: tuple[str, str], use: bool = True
) -> list[dict[str, Any]]:
    return run_ranks(
        functools.partial(_disagree, modes=modes, cumem=cumem, use=use),
        2,
        timeout=90,
        env={**GATE, "SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT": WATCHDOG_S},
    )


STRICT_CASES = {
    "cumem": (("suspend", "suspend"), ("", "0"), "NCCL_CUMEM_ENABLE=0 on ranks 1"),
    "mode": (("suspend", "wrapper"), ("", ""), "SLIME_RELOADABLE_PG_MODE=wrapper on ranks 1"),
}


@pytest.mark.parametrize("case", sorted(STRICT_CASES))
def test_in_suspend_mode_ranks_that_would_take_different_ways_all_refuse_at_once(
    case: str,
) -> None:
    """Suspend mode on rank 0; rank 1 with ``NCCL_CUMEM_ENABLE=0`` (its ``new_group`` refuses
    at once, which the program catches) or in wrapper mode. Every rank's destroy raises
    ``ModeRefusedError`` within ``PROMPT_S`` naming the group, rank 1 and the variable with
    its values, and no suspend reaches any backend (never a lone rank in a suspend barrier
    until the watchdog ends it)."""
    modes, cumem, variable = STRICT_CASES[case]
    # Where rank 1 refused the group at creation, rank 0 alone holds it: no collective on it.
    reports = _run_disagree(modes, cumem, use=case == "mode")
    name = reports[0]["name"]
    for rank, out in enumerate(reports):
        kind, text = out["destroy"]
        assert kind == "ModeRefusedError", (rank, out)
        assert out["destroy s"] < PROMPT_S, (rank, out["destroy s"])
        assert variable in text, (rank, text)
        assert f"group {name!r}" in text, (rank, text)
        assert out["lifecycle calls"] == [], (rank, out["lifecycle calls"])
        assert out["sum"] == (3.0 if case == "mode" else None), (rank, out["sum"])


AUTO_CASES = {
    "cumem": (("auto", "auto"), ("", "0")),
    "mode": (("auto", "wrapper"), ("", "")),
    "mode, the other rank": (("wrapper", "auto"), ("", "")),
}


@pytest.mark.parametrize("case", sorted(AUTO_CASES))
def test_in_auto_mode_ranks_that_would_take_different_ways_take_a_common_one(case: str) -> None:
    """``auto`` on one rank; the other with ``NCCL_CUMEM_ENABLE=0``, or in wrapper mode: every
    rank takes one way the group can take everywhere, so the cycle completes within
    ``PROMPT_S`` on every rank, no suspend reaches any backend (nobody waits alone in a
    barrier), and the group works after the reload. That way frees the memory where it can:
    on torch 2.13 every member holds the group behind a wrapper, so it is destroyed and
    created again; on 2.14 a member holds torch's own object, so it stays resident."""
    modes, cumem = AUTO_CASES[case]
    for rank, out in enumerate(_run_disagree(modes, cumem)):
        if ON_214:
            assert [r.split()[0] for r in out["report"]["resident"]] == [out["name"]], out
        else:
            assert out["report"]["destroyed"] == [out["name"]], (rank, out["report"])
        assert out["create"] == ("ok", ""), (rank, out)
        assert out["destroy"] == ("ok", ""), (rank, out)
        assert out["destroy s"] < PROMPT_S, (rank, out["destroy s"])
        assert out["reload"] == ("ok", ""), (rank, out)
        assert out["lifecycle calls"] == [], (rank, out["lifecycle calls"])
        assert out["sum"] == 3.0, (rank, out["sum"])
