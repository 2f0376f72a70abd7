"""WORLD's swap leaves torch as it was.

A swap that fails says what state WORLD is in and how to recover (the one injected fault: a
temporary WORLD that cannot be created, because nothing real fails there on CPU); after each
destroy and reload, ``sys.excepthook`` and torch's other process-global state are as they were;
after 1,000 swaps an uncaught exception prints one ``[rank0]: `` prefix per line. The oracles:
torch's own state read before and after, the text an uncaught exception prints, and
``is_initialized()``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from tests.support import PROGRAMS, world_ranks
from tests.support.ranks import GATE, Rank, run_ranks, total
from tests.support.venv import ROOT, clean_env

pytestmark = pytest.mark.timeout(300)

# ---- a swap that fails ---------------------------------------------------------------------------


#: Words that say, in the error of a failed swap, in what state WORLD is now.
STATE_GONE = re.compile(r"not initiali[sz]ed|destroyed|is gone|no WORLD|torn down|no longer", re.I)
STATE_KEPT = re.compile(r"unchanged|as it was|intact|still (usable|works|live|in place)", re.I)


class _FailingTemporaryWorld:
    """FAULT INJECTION: the temporary WORLD of the next destroy cannot be created.

    Nothing real makes that creation fail on CPU, so the first default group torch is asked to
    build after ``arm()`` (in a destroy, that is the temporary WORLD) raises instead. It sits at
    torch's ``_new_process_group_helper``, which ``init_process_group`` calls whichever
    reference to ``init_process_group`` the caller holds; ``fired`` says it did.
    """

    MESSAGE = "injected fault: the temporary WORLD cannot be created"

    def __init__(self) -> None:
        from torch.distributed import distributed_c10d as c10d

        self.armed = False
        self.fired = 0
        self.worlds_built = 0
        self._helper = c10d._new_process_group_helper
        c10d._new_process_group_helper = self._faulty

    def arm(self) -> None:
        self.armed = True

    def _faulty(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("group_desc") == "default_pg":
            if self.armed:
                self.armed = False
                self.fired += 1
                raise RuntimeError(self.MESSAGE)
            self.worlds_built += 1
        return self._helper(*args, **kwargs)


def _failed_swap(ctx: Rank) -> dict:
    import reloadpg_autopatch as rpg

    dist = world_ranks.begin(ctx)
    rpg.register_default_process_group(world_ranks.TIMEOUT, accelerator_backends=world_ranks.SWAP)
    pair = dist.new_group([0, 1])
    rpg.destroy_process_groups()
    rpg.reload_process_groups()  # one good cycle first
    fault = _FailingTemporaryWorld()
    fault.arm()
    out: dict[str, Any] = {}
    try:
        rpg.destroy_process_groups()
        out["error"] = None
    except Exception as error:
        out["error"] = world_ranks.error_text(error)
        out["message"] = str(error)
    out["fired"] = fault.fired
    out["initialized"] = dist.is_initialized()
    # Never half-gone: a group of the lost world says that world ended (not "reload first"),
    # and the package holds none of its groups any more, before anything else is called.
    try:
        dist.all_reduce(__import__("torch").ones(1), group=pair)
        out["old_group"] = "no error"
    except Exception as error:
        out["old_group"] = str(error)
    out["held_after"] = len(rpg.reloadable_groups())
    try:
        if out["initialized"]:
            # The world as it was: WORLD and the group work, and the cycle can go on.
            out["sums_after"] = [total(None, ctx.rank + 1), total(pair, ctx.rank + 1)]
        else:
            # WORLD is gone: a fresh world, registered, must cycle as any world does.
            ctx.reinit("after-failed-swap/", world_ranks.TIMEOUT)
            rpg.register_default_process_group(
                world_ranks.TIMEOUT, accelerator_backends=world_ranks.SWAP
            )
            pair = dist.new_group([0, 1])
        built = fault.worlds_built
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        out["worlds_built_in_cycle"] = fault.worlds_built - built
        out["sums_after_cycle"] = [total(None, ctx.rank + 1), total(pair, ctx.rank + 1)]
        out["recovery"] = "no error"
    except Exception as error:
        out["recovery"] = world_ranks.error_text(error)
    return out


def test_a_swap_that_fails_says_what_state_world_is_in_and_how_to_recover() -> None:
    """The temporary WORLD's creation fails (injected) on every rank during a destroy. The
    error says what state WORLD is in and how to recover; afterwards WORLD either works as it
    was, or ``is_initialized()`` is False and a fresh init, registration and cycle work (with
    WORLD swapped: torch builds the temporary and the restored WORLD)."""
    for rank, report in enumerate(run_ranks(_failed_swap, 2, timeout=150, env=GATE)):
        assert report["fired"] == 1, report  # the fault was injected where it was meant to be
        assert report["error"] is not None, report
        message = report["message"]
        if report["initialized"]:
            assert STATE_KEPT.search(message), (rank, message)
            assert "destroy_process_groups()" in message, (rank, message)  # call it again
            assert report["sums_after"] == [3.0, 3.0], (rank, report)
        else:
            assert STATE_GONE.search(message), (rank, message)
            assert "init_process_group" in message, (rank, message)  # the way back
            assert "WORLD that was destroyed" in report["old_group"], (rank, report)
            assert report["held_after"] == 0, (rank, report)
        assert report["recovery"] == "no error", (rank, report)
        assert report["worlds_built_in_cycle"] == 2, (rank, report)
        assert report["sums_after_cycle"] == [3.0, 3.0], (rank, report)


# ---- torch's process-global state is as it was after a swap --------------------------------


def _process_globals() -> dict[str, Any]:
    """Process-global state that torch's init_process_group / destroy_process_group (or
    anything a swap calls) could change: hooks, handlers, streams, environment, module globals.
    """
    import atexit
    import faulthandler
    import gc
    import logging
    import signal
    import threading
    import warnings

    from torch.distributed import distributed_c10d as c10d

    handlers = {}
    for sig in sorted(signal.valid_signals()):
        try:
            handlers[int(sig)] = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
    loggers = {"<root>": logging.getLogger()}
    loggers.update(
        (name, logger)
        for name, logger in logging.Logger.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    )
    return {
        "sys.excepthook": sys.excepthook,
        "threading.excepthook": threading.excepthook,
        "sys.unraisablehook": sys.unraisablehook,
        "sys.displayhook": sys.displayhook,
        "sys.breakpointhook": sys.breakpointhook,
        "sys.stdout": sys.stdout,
        "sys.stderr": sys.stderr,
        "sys.gettrace()": sys.gettrace(),
        "sys.getprofile()": sys.getprofile(),
        "sys.getrecursionlimit()": sys.getrecursionlimit(),
        "signal handlers": handlers,
        "atexit callbacks": atexit._ncallbacks(),
        "faulthandler.is_enabled()": faulthandler.is_enabled(),
        "gc.callbacks": list(gc.callbacks),
        "warnings.filters": list(warnings.filters),
        "os.environ": dict(os.environ),
        "sys.path": list(sys.path),
        "sys.meta_path": list(sys.meta_path),
        "logging.disable": logging.root.manager.disable,
        "loggers": {
            name: (
                tuple(logger.handlers),
                logger.level,
                logger.propagate,
                logger.disabled,
                tuple(logger.filters),
            )
            for name, logger in loggers.items()
        },
        "python threads": sorted(t.name for t in threading.enumerate()),
        "c10d._backend": c10d._backend,
        "c10d._default_pg_init_method": c10d._default_pg_init_method,
    }


#: A logger created after the first snapshot (a lazy import) is as torch's default makes it.
_NEW_LOGGER = ((), 0, True, False, ())


def _differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    out = []
    for key, old in before.items():
        new = after[key]
        if key == "loggers":
            for name in sorted(set(old) | set(new)):
                if old.get(name, _NEW_LOGGER) != new.get(name, _NEW_LOGGER):
                    out.append(f"logger {name!r}")
        elif isinstance(old, dict):
            for name in sorted(set(old) | set(new), key=str):
                if old.get(name, "<unset>") != new.get(name, "<unset>"):
                    out.append(f"{key}[{name!r}]: {old.get(name)!r} -> {new.get(name)!r}")
        elif old is not new and old != new:
            out.append(f"{key}: {old!r} -> {new!r}")
    return out


def _rendered_traceback() -> str:
    """What ``sys.excepthook`` prints for an uncaught exception now."""
    import io

    try:
        raise RuntimeError("uncaught in the rank")
    except RuntimeError:
        info = sys.exc_info()
    saved, sys.stderr = sys.stderr, io.StringIO()
    try:
        sys.excepthook(*info)
        return sys.stderr.getvalue()
    finally:
        sys.stderr = saved


def _globals_across_cycles(ctx: Rank) -> dict:
    import reloadpg_autopatch as rpg

    dist = world_ranks.begin(ctx)
    rpg.register_default_process_group(world_ranks.TIMEOUT, accelerator_backends=world_ranks.SWAP)
    hook = sys.excepthook  # torch's, from the real init_process_group
    first = _process_globals()
    worlds = world_ranks.DefaultGroups()
    steps = []
    for cycle in range(5):
        rpg.destroy_process_groups()
        asleep = _differences(first, _process_globals())
        rpg.reload_process_groups()
        steps.append(
            {
                "cycle": cycle + 1,
                "after_destroy": asleep,
                "after_reload": _differences(first, _process_globals()),
                "sum": total(dist.group.WORLD, 1.0),
            }
        )
    return {
        "torchs_hook": f"{hook.__module__}.{hook.__qualname__}",
        "same_hook": sys.excepthook is hook,
        "steps": steps,
        "worlds_built": worlds.built,
        "traceback": _rendered_traceback(),
    }


def _prefixes(text: str, marker: str) -> list[int]:
    """``[rank0]: `` prefixes on each line of the traceback that ends at ``marker``."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    ends = [i for i, line in enumerate(lines) if marker in line and "raise" not in line]
    assert len(starts) == 1, text[-4000:]
    assert ends, text[-4000:]
    return [line.count("[rank0]: ") for line in lines[starts[0] : ends[-1] + 1] if line]


def test_a_swap_leaves_torchs_process_globals_as_they_were() -> None:
    """Five cycles on one rank: after each destroy and each reload, ``sys.excepthook`` is still
    torch's first hook and no other process-global state differs from before the first cycle;
    an uncaught exception prints one ``[rank0]: `` per line."""
    (report,) = run_ranks(_globals_across_cycles, 1, timeout=90, env=GATE)
    assert report["torchs_hook"].startswith("torch.distributed"), report["torchs_hook"]
    assert report["worlds_built"] == 10, report  # every cycle really swapped WORLD
    for step in report["steps"]:
        assert step["after_destroy"] == [], step
        assert step["after_reload"] == [], step
        assert step["sum"] == 1.0, step
    assert report["same_hook"], report
    assert set(_prefixes(report["traceback"], "uncaught in the rank")) == {1}, report["traceback"]


CYCLES = 1000


@pytest.mark.timeout(240)
def test_an_uncaught_exception_after_a_thousand_cycles_prints_one_prefix_per_line(
    tmp_path,
) -> None:
    """1,000 swaps, then an uncaught exception: its traceback printed once, each line with one
    ``[rank0]: `` (torch's hook from the real init), no RecursionError. About 25 s here."""
    proc = subprocess.run(
        [sys.executable, str(PROGRAMS / "cycles_then_raise.py"), str(CYCLES)],
        env=clean_env(PYTHONPATH=str(ROOT), **GATE),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=220,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, (proc.stdout[-2000:], proc.stderr[-2000:])
    summary = json.loads(lines[-1])
    assert summary["patched"], summary
    assert summary["worlds_built"] == 2 * CYCLES, summary  # each cycle swapped WORLD
    assert proc.returncode == 1, proc.stderr[-3000:]  # the uncaught exception's exit status
    stderr = proc.stderr
    assert "RecursionError" not in stderr, stderr[-3000:]
    assert "Error in sys.excepthook" not in stderr, stderr[-3000:]
    assert stderr.count("Traceback (most recent call last)") == 1, stderr[-3000:]
    assert set(_prefixes(stderr, "uncaught after the cycles")) == {1}, stderr[-3000:]
