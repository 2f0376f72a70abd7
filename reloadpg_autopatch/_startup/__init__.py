"""Start-up where something is to be checked or said: the gate's value, the other variables.

The ``.pth`` line imports ``_reloadpg_autopatch_boot`` (a top-level module, so that the gate on
costs one module at start-up), which comes here only where a variable of ours other than an
on gate is set, or where a callback runs. This module imports ``os``, ``sys``, ``_env`` and the
boot module. A bad value of another variable is found by ``problems`` and said here, one line
each, once; what runs once ``torch.distributed`` is imported (the patch, the watchers'
callbacks) is in ``landing``, and its failures are said here too. The site files are ``pth``.
"""

import os
import sys

import _reloadpg_autopatch_boot as boot

from .._env import (
    ADOPT_MODULES_ENV,
    GATE,
    OFF_VALUES,
    ON_VALUES,
    VARIABLES,
    excerpt,
    first_report,
    parse_adopt_modules,
)

_state: dict = {"warned": set()}


def warn_once(key: str, message: str, variable: str | None = None) -> None:
    """One line on stderr per problem and process, however often the ``.pth`` is processed.

    With ``variable``, the problem is that variable's value: said once per process whichever
    layer reads it first (``_env.first_report``).
    """
    if key in _state["warned"]:
        return
    if variable is not None and not first_report(variable, os.environ.get(variable, "")):
        return
    _state["warned"].add(key)
    try:  # noqa: SIM105 - contextlib is not loaded at start-up; this path must stay cheap
        sys.stderr.write(f"reloadpg_autopatch: {message}\n")
    except Exception:  # noqa: S110 - a closed stderr must not stop the interpreter
        pass


def gate_verdict(value: str | None) -> tuple[bool, str | None]:
    """``(activate, problem)`` for a gate value; the value is compared, never evaluated."""
    if value is None:
        return False, None
    normalised = value.strip().lower()
    if normalised in ON_VALUES:
        return True, None
    if normalised in OFF_VALUES:
        return False, None
    on, off = ", ".join(ON_VALUES), ", ".join(OFF_VALUES[1:])
    return False, (
        f"{GATE}={excerpt(value)} is not understood, so the patch stays off; use one of {on} "
        f"to activate, or unset, empty, {off} to leave torch untouched"
    )


def patch_now() -> bool:
    """Apply the patch and sweep (``landing.patch``); report a failure once instead of raising.
    Returns success."""
    try:
        from . import landing

        landing.patch(_register_with_dynamo)
    except Exception as error:
        message = (
            "patching torch.distributed failed, it stays unpatched: "
            f"{type(error).__name__}: {error}"
        )
        _say_error("patch", message)
        return False
    return True


def _say_error(key: str, message: str) -> None:
    """Through the package's logger where the user configured one, else one stderr line."""
    try:
        from . import landing

        logger = landing.error_logger()
        if logger is not None:
            logger.error(message)
            return
    except Exception:  # noqa: S110 - fall back to the plain line below
        pass
    warn_once(key, message)


def _register_with_dynamo() -> None:
    try:
        from . import landing

        landing.register_with_dynamo()
    except Exception as error:  # compiled code then runs eagerly; the import must go on
        warn_once(
            "dynamo", f"registering with torch.compile failed: {type(error).__name__}: {error}"
        )


def adopt_on_import(module: object) -> None:
    """The adoption watcher's callback (``boot.activate``): adopt ``module`` as it executes."""
    from . import landing

    landing.adopt_on_import(module)


def _rebind_on_import(module: object) -> None:
    from . import landing

    landing.rebind_on_import(module)


def _report_problems() -> None:
    """Say each bad value of the other variables once, where the user looks; watch the modules
    ``SLIME_RELOADABLE_PG_REBIND`` names so each is swept as soon as it has executed."""
    from . import problems

    for key, message, variable in problems.start_up_problems():
        warn_once(key, message, variable)
    prefixes = problems.watched_rebind_prefixes()
    if prefixes:
        boot.watch(prefixes, _rebind_on_import)


def activate(source: str) -> None:
    """Say each bad value of the other variables once, then ``boot.activate``: patch
    ``torch.distributed`` as soon as it is imported, adopt the frameworks' lifecycle modules.

    Idempotent: a ``.pth`` can be processed twice in a venv, and the ``.start`` entry point and
    an explicit call may both run.
    """
    if boot.STATE["activated"]:
        return
    if any(os.environ.get(variable) for variable in VARIABLES if variable != GATE):
        _report_problems()
    boot.activate(source, parse_adopt_modules(os.environ.get(ADOPT_MODULES_ENV))[0])


def activate_from_site() -> None:
    """Entry point of the ``.pth`` line and of the ``.start`` file: gate, then activate."""
    try:
        on, problem = gate_verdict(os.environ.get(GATE))
        if problem is not None:
            warn_once("gate", problem, GATE)
        if on:
            activate("site")
    except BaseException as error:  # the host process must always start
        warn_once("bootstrap", f"activation failed: {type(error).__name__}: {error}")


def status() -> dict[str, object]:
    """What activation did in this process (for the doctor)."""
    return {
        "activated": boot.STATE["activated"],
        "source": boot.STATE["source"],
        "warnings": sorted(_state["warned"]),
    }
