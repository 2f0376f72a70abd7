"""Start-up activation: read the gate, install the import finder, never raise.

This module is imported by the ``.pth`` line (and called through the PEP 829 ``.start`` entry
point) in every Python process of an image where the gate is on, so it imports only ``os`` and
``sys``, which site has already loaded, and ``_env``, which imports nothing. Logging, the hook's
callback and everything that touches torch wait until ``torch.distributed`` is imported, when
torch has loaded them anyway.
"""

import os
import sys

from .._env import (
    ADOPT_ENV,
    ADOPT_MODULES_ENV,
    EVERY_CALL_ENV,
    FAIL_ENV,
    GATE,
    LOG_ENV,
    LOG_LEVELS,
    MIN_FREE_ENV,
    MODE_ENV,
    MODES_GROUP,
    OFF_VALUES,
    ON_VALUES,
    REBIND_ENV,
    SUSPEND_TIMEOUT_ENV,
    every_call_problem,
    excerpt,
    failure_problem,
    first_report,
    min_free_problem,
    mode_problem,
    parse_adopt,
    parse_adopt_modules,
    parse_prefixes,
    suspend_timeout_problem,
)

#: The top-level package: every module of it counts for deferring the patch.
_PACKAGE = __name__.split(".", 1)[0]

_state = {"activated": False, "warned": set(), "source": None}


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


def log_level_problem() -> str | None:
    """What is wrong with ``SLIME_RELOADABLE_PG_LOG``, if anything (unset is fine)."""
    raw = os.environ.get(LOG_ENV, "").strip()
    if not raw or raw.upper() in LOG_LEVELS:
        return None
    return (
        f"{LOG_ENV}={excerpt(raw)} is not a log level; use one of {', '.join(LOG_LEVELS)} "
        "(logging stays at its default)"
    )


def log_level() -> str | None:
    """The level named by ``SLIME_RELOADABLE_PG_LOG`` (None when unset or invalid)."""
    problem = log_level_problem()
    if problem is not None:
        warn_once("log", problem, LOG_ENV)
        return None
    return os.environ.get(LOG_ENV, "").strip().upper() or None


def plugin_modes() -> list[str]:
    """The modes installed distributions register (``_env.MODES_GROUP``): read only for a mode
    that is none of the package's own (importlib.metadata reads every distribution)."""
    try:
        from importlib.metadata import entry_points

        return sorted({point.name for point in entry_points(group=MODES_GROUP)})
    except Exception:  # a broken distribution must not stop start-up: no plugin then
        return []


def reload_mode_problem() -> str | None:
    """What is wrong with ``SLIME_RELOADABLE_PG_MODE``, if anything (unset is fine)."""
    raw = os.environ.get(MODE_ENV)
    if mode_problem(raw) is None:
        return None
    return mode_problem(raw, plugin_modes())


def rebind_prefixes() -> str | None:
    """The raw ``SLIME_RELOADABLE_PG_REBIND`` value (validated when the patch runs)."""
    raw = os.environ.get(REBIND_ENV, "").strip()
    return raw or None


def _configure_logging() -> None:
    level = log_level()
    if level is None:
        return
    import logging

    logger = logging.getLogger("reloadpg_autopatch")
    logger.setLevel(level)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("reloadpg_autopatch %(levelname)s: %(message)s"))
        logger.addHandler(handler)


def patch_now() -> bool:
    """Apply the patch and sweep; report a failure once instead of raising. Returns success."""
    try:
        _configure_logging()
        from ..patching import apply, dynamo

        apply.patch(_valid_rebind_prefixes(), load_dynamo_table=False)
        _adopt_loaded()
        if dynamo.MODULE not in sys.modules:
            from . import finder

            finder.install(dynamo.MODULE, _register_with_dynamo)
    except Exception as error:
        message = (
            "patching torch.distributed failed, it stays unpatched: "
            f"{type(error).__name__}: {error}"
        )
        try:
            import logging

            logger = logging.getLogger("reloadpg_autopatch")
            if logger.hasHandlers():
                logger.error(message)
                return False
        except Exception:  # noqa: S110 - fall back to the plain line below
            pass
        warn_once("patch", message)
        return False
    return True


def _valid_rebind_prefixes() -> str | None:
    prefixes = rebind_prefixes()
    try:
        parse_prefixes(prefixes)
    except (TypeError, ValueError) as error:
        message = f"{REBIND_ENV}: {error}; sweeping the default prefixes instead"
        warn_once("rebind", message, REBIND_ENV)
        return None
    return prefixes


def _register_with_dynamo() -> None:
    try:
        from ..patching import dynamo

        dynamo.register(load=False)
    except Exception as error:  # compiled code then runs eagerly; the import must go on
        warn_once(
            "dynamo", f"registering with torch.compile failed: {type(error).__name__}: {error}"
        )


def _rebind_on_import(module: object) -> None:
    """Sweep a module under ``SLIME_RELOADABLE_PG_REBIND`` as soon as it has executed."""
    if "reloadpg_autopatch.patching.patchset" not in sys.modules:
        return  # not patched yet: the patch sweeps every module already loaded
    from ..patching import sweep

    sweep.rebind_module(module)


def _watch_rebind_prefixes() -> None:
    """Modules under explicitly named prefixes are swept whenever they finish importing."""
    raw = rebind_prefixes()
    if raw is None:
        return
    try:
        items = parse_prefixes(raw)
    except ValueError:
        return  # reported when it patches, which then sweeps the default prefixes
    if "*" in items:
        return  # swept by the patch itself: every module is already loaded or is torch's
    from . import finder

    finder.watch(items, _rebind_on_import)


def adoption_problems() -> list[str]:
    """What is wrong with ``SLIME_RELOADABLE_PG_ADOPT`` and ``..._ADOPT_MODULES``, a line each."""
    problems = []
    try:
        parse_adopt(os.environ.get(ADOPT_ENV))
    except ValueError as error:
        problems.append(str(error))
    return problems + parse_adopt_modules(os.environ.get(ADOPT_MODULES_ENV))[1]


def _adopt_on_import(module: object) -> None:
    """A framework's lifecycle module has executed: adopt it before anyone imports from it."""
    if "reloadpg_autopatch.patching.patchset" not in sys.modules:
        return  # not patched yet: the patch adopts every such module already loaded
    from ..adoption import handling

    handling.on_import(module)


def _adopt_loaded() -> None:
    """The patch has landed: adopt the lifecycle modules imported before it. The adoption is
    imported only where one is loaded (the patch usually lands inside ``import torch``, before
    any framework module exists)."""
    watched = parse_adopt_modules(os.environ.get(ADOPT_MODULES_ENV))[0]
    if not any(name in sys.modules for name in watched):
        return
    from ..adoption import landing

    landing.after_patch()


def _watch_adoption() -> None:
    """The frameworks' lifecycle modules are handed to the adoption as each finishes importing
    (adopted, or kept and guarded when the switch is off)."""
    from . import finder

    finder.watch(parse_adopt_modules(os.environ.get(ADOPT_MODULES_ENV))[0], _adopt_on_import)


def activate(source: str) -> None:
    """Patch ``torch.distributed`` as soon as it is imported (at once if it already is).

    Idempotent: a ``.pth`` can be processed twice in a venv, and the ``.start`` entry point and
    an explicit call may both run.
    """
    if _state["activated"]:
        return
    _state["activated"] = True
    _state["source"] = source
    log_level()  # report bad values at start-up, where the user looks for them
    problem = reload_mode_problem()
    if problem is not None:
        warn_once("mode", problem, MODE_ENV)
    for variable, check in (
        (MIN_FREE_ENV, min_free_problem),
        (EVERY_CALL_ENV, every_call_problem),
        (SUSPEND_TIMEOUT_ENV, suspend_timeout_problem),
        (FAIL_ENV, failure_problem),
    ):
        problem = check(os.environ.get(variable))
        if problem is not None:  # read again at each step: said here once, where users look
            warn_once(variable, problem, variable)
    for number, problem in enumerate(adoption_problems()):
        warn_once(f"adopt-{number}", problem)
    _watch_rebind_prefixes()
    _watch_adoption()
    module = sys.modules.get("torch.distributed")
    if module is not None and getattr(module, "__spec__", None) is not None:
        patch_now()
        return
    from . import finder

    # The patch is built from our own modules: if one of them is what imports torch, wait
    # until it has finished importing.
    finder.install("torch.distributed", patch_now, defer_prefix=_PACKAGE + ".")


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
        "activated": _state["activated"],
        "source": _state["source"],
        "warnings": sorted(_state["warned"]),
    }
