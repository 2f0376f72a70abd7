"""Registering WORLD: once, with arguments that say what they accept.

The same arguments twice do nothing; other arguments raise naming the parameter, and WORLD
stays the first registration's; a timeout of zero or less, an unknown temporary backend or one
that serves no CPU fails at the registration, naming what is accepted, and registers nothing; a
second registration with another temporary backend raises and the first stays in force. The
oracles are torch's: the default groups it builds (counted at ``_new_process_group_helper``),
its backend's options, collective results, and the exceptions raised.
"""

from __future__ import annotations

import functools
import re
from datetime import timedelta
from typing import Any

import pytest

from tests.support import accelerator, world_ranks
from tests.support.ranks import GATE, Rank, run_ranks, total

pytestmark = pytest.mark.timeout(300)

# ---- registering WORLD twice ---------------------------------------------------------------------


def _identity_cycles(dist: Any, saved: Any, rank: int, cycles: int) -> list[dict]:
    import torch
    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch as rpg

    worlds = world_ranks.DefaultGroups()
    out = []
    for _ in range(cycles):
        built = worlds.built
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        backend = saved._get_backend(torch.device("cpu"))
        out.append(
            {
                "same": [
                    dist.group.WORLD is saved,
                    dist.GroupMember.WORLD is saved,
                    c10d._get_default_group() is saved,
                ],
                "sums": [total(None, rank + 1), total(saved, rank + 1)],
                "worlds_built": worlds.built - built,
                "timeout_s": backend.options._timeout.total_seconds(),
            }
        )
    return out


def _register_twice(ctx: Rank) -> dict:
    import reloadpg_autopatch as rpg

    dist = world_ranks.begin(ctx)
    rpg.register_default_process_group(world_ranks.TIMEOUT, accelerator_backends=world_ranks.SWAP)
    saved = dist.group.WORLD
    out: dict[str, Any] = {}
    try:
        rpg.register_default_process_group(
            world_ranks.TIMEOUT, accelerator_backends=world_ranks.SWAP
        )
        out["same_args"] = "no error"
    except Exception as error:
        out["same_args"] = world_ranks.error_text(error)
    out["after_same"] = _identity_cycles(dist, saved, ctx.rank, 3)
    try:
        rpg.register_default_process_group(
            2 * world_ranks.TIMEOUT, accelerator_backends=world_ranks.SWAP
        )
        out["other_timeout"] = {"error": None}
    except Exception as error:
        out["other_timeout"] = {
            "error": world_ranks.error_text(error),
            "runtime_error": isinstance(error, RuntimeError),
            "message": str(error),
        }
    try:  # the backends torch registers for accelerators (None), where gloo was asked
        rpg.register_default_process_group(world_ranks.TIMEOUT)
        out["other_backends"] = {"error": None}
    except Exception as error:
        out["other_backends"] = {
            "error": world_ranks.error_text(error),
            "runtime_error": isinstance(error, RuntimeError),
            "message": str(error),
        }
    out["after_other"] = _identity_cycles(dist, saved, ctx.rank, 3)
    return out


def test_registering_world_twice_keeps_the_first_registration() -> None:
    """The same arguments again: nothing happens. Other arguments (a timeout, the accelerator
    backends): a RuntimeError naming the parameter. Either way WORLD stays one object, swapped
    every cycle, with the first registration's timeout (torch's own backend options say
    which)."""
    for report in run_ranks(_register_twice, 2, timeout=150, env=GATE):
        assert report["same_args"] == "no error", report["same_args"]
        other = report["other_timeout"]
        assert other["error"] is not None, "registering again with another timeout raised nothing"
        assert other["runtime_error"], other
        assert "timeout" in other["message"], other
        backends = report["other_backends"]
        assert backends["error"] is not None, "registering again with other backends passed"
        assert backends["runtime_error"], backends
        assert "accelerator_backends" in backends["message"], backends
        for label in ("after_same", "after_other"):
            for cycle in report[label]:
                assert cycle["same"] == [True, True, True], (label, cycle)
                assert cycle["sums"] == [3.0, 3.0], (label, cycle)
                assert cycle["worlds_built"] == 2, (label, cycle)  # temporary and restored
                assert cycle["timeout_s"] == world_ranks.TIMEOUT.total_seconds(), (label, cycle)


# ---- arguments checked at registration -----------------------------------------------------------


BAD_REGISTRATIONS = {
    "negative-timeout": ({"timeout": timedelta(seconds=-1)}, "timeout"),
    "zero-timeout": ({"timeout": timedelta(0)}, "timeout"),
    "unknown-temporary-backend": ({"temporary_backend": "nosuchbackend"}, "temporary_backend"),
}
#: What an error for a bad timeout says is accepted.
ACCEPTED_TIMEOUT = re.compile(r"positive|greater than (0|zero)|> ?0|more than (0|zero)", re.I)


def _bad_registration(ctx: Rank, case: str) -> dict:
    import time

    import reloadpg_autopatch as rpg

    dist = world_ranks.begin(ctx)
    kwargs, _ = BAD_REGISTRATIONS[case]
    out: dict[str, Any] = {}
    started = time.monotonic()
    try:
        rpg.register_default_process_group(**{"accelerator_backends": world_ranks.SWAP, **kwargs})
        out["bad"] = {"error": None}
    except Exception as error:
        out["bad"] = {
            "error": world_ranks.error_text(error),
            "value_error": isinstance(error, ValueError),
            "message": str(error),
        }
    out["seconds"] = time.monotonic() - started
    # Nothing registered: torch's own default group is still WORLD, no stand-in in its place.
    out["world_is_torchs"] = type(dist.group.WORLD) is dist.ProcessGroup
    try:
        rpg.register_default_process_group(
            world_ranks.TIMEOUT, accelerator_backends=world_ranks.SWAP
        )
        out["good"] = "no error"
        out["cycles"] = _identity_cycles(dist, dist.group.WORLD, ctx.rank, 2)
    except Exception as error:
        out["good"] = world_ranks.error_text(error)
    return out


@pytest.mark.parametrize("case", list(BAD_REGISTRATIONS))
def test_bad_registration_arguments_fail_at_registration(case: str) -> None:
    """A negative or zero WORLD timeout, or an unknown temporary backend: ValueError at once,
    naming the parameter and what is accepted; nothing is registered, and a correct
    registration afterwards swaps WORLD every cycle."""
    _, parameter = BAD_REGISTRATIONS[case]
    (report,) = run_ranks(functools.partial(_bad_registration, case=case), 1, timeout=90, env=GATE)
    bad = report["bad"]
    assert bad["error"] is not None, f"{case}: register_default_process_group accepted it"
    assert bad["value_error"], bad
    assert report["seconds"] < 1.0, report
    message = bad["message"]
    assert parameter in message, bad
    if parameter == "timeout":
        assert ACCEPTED_TIMEOUT.search(message), bad
    else:
        assert "nosuchbackend" in message, bad
        assert "gloo" in message, bad  # an accepted backend is named
    assert report["world_is_torchs"], report
    assert report["good"] == "no error", report
    for cycle in report["cycles"]:
        assert cycle["same"] == [True, True, True], cycle
        assert cycle["sums"] == [1.0, 1.0], cycle
        assert cycle["worlds_built"] == 2, cycle


# ---- the temporary backend: one that serves no CPU, and another one later ------------------------


def _registrations(ctx: Rank) -> dict[str, Any]:
    _torch, dist, rpg, _s = accelerator.start(ctx, "wrapper")
    out: dict[str, Any] = {}

    def attempt(**kwargs: Any) -> tuple[Any, str]:
        try:
            rpg.register_default_process_group(accelerator_backends=("gloo",), **kwargs)
            return ("registered", "")
        except Exception as error:
            return (type(error), str(error))

    out["accelerator only"] = attempt(temporary_backend=accelerator.ACCEL)
    out["first"] = attempt(temporary_backend="gloo")
    out["same again"] = attempt(temporary_backend="gloo")
    out["another"] = attempt(temporary_backend="cpu:gloo")
    group = dist.new_group([0, 1])
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    out["sum"] = accelerator.rank_sum(dist, _torch, ctx.rank, group)
    return out


@pytest.mark.timeout(240)
def test_registration_refuses_a_temporary_backend_that_serves_no_cpu() -> None:
    """The temporary WORLD runs on the CPU: a backend registered for an accelerator only is
    refused with ``ValueError`` naming it and what is accepted, and nothing is registered
    (the next registration, with gloo, takes effect)."""
    for out in accelerator.run_once(_registrations):
        kind, text = out["accelerator only"]
        assert kind is ValueError, out["accelerator only"]
        assert f"temporary_backend={accelerator.ACCEL!r} serves no CPU device" in text, text
        assert "'gloo'" in text, text
        assert out["first"] == ("registered", "")


@pytest.mark.timeout(240)
def test_a_second_registration_with_another_temporary_backend_raises() -> None:
    """Registering again with the same arguments does nothing; with another temporary backend
    it raises ``RegistrationError`` naming both, and the first registration stays in force
    (the cycle still swaps WORLD and the group works)."""
    import reloadpg_autopatch as rpg

    for out in accelerator.run_once(_registrations):
        assert out["same again"] == ("registered", "")
        kind, text = out["another"]
        assert kind is rpg.RegistrationError, out["another"]
        assert "temporary_backend='cpu:gloo' (registered: 'gloo')" in text, text
        assert out["sum"] == 3.0
