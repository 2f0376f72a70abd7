"""A bad value of a variable besides the gate: found here, said by the start-up module.

Imported only where one of the package's variables besides the gate is set (or when the patch
lands, by ``landing``): a process whose environment holds the gate alone loads nothing of this
at start-up. Each function returns what is wrong instead of saying it, so that the one module
that writes start-up lines (the package's ``warn_once``) says each once per process.
"""

import os

from .._env import (
    ADOPT_ENV,
    ADOPT_MODULES_ENV,
    EVERY_CALL_ENV,
    FAIL_ENV,
    LOG_ENV,
    LOG_LEVELS,
    MIN_FREE_ENV,
    MODE_ENV,
    MODES_GROUP,
    REBIND_ENV,
    SUSPEND_MIN_FREED_ENV,
    SUSPEND_TIMEOUT_ENV,
    every_call_problem,
    excerpt,
    failure_problem,
    min_free_problem,
    mode_problem,
    parse_adopt,
    parse_adopt_modules,
    parse_prefixes,
    suspend_min_freed_problem,
    suspend_timeout_problem,
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
    if log_level_problem() is not None:
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


def adoption_problems() -> list[str]:
    """What is wrong with ``SLIME_RELOADABLE_PG_ADOPT`` and ``..._ADOPT_MODULES``, a line each."""
    problems = []
    try:
        parse_adopt(os.environ.get(ADOPT_ENV))
    except ValueError as error:
        problems.append(str(error))
    return problems + parse_adopt_modules(os.environ.get(ADOPT_MODULES_ENV))[1]


def rebind_prefixes() -> str | None:
    """The raw ``SLIME_RELOADABLE_PG_REBIND`` value (None when unset or blank)."""
    raw = os.environ.get(REBIND_ENV, "").strip()
    return raw or None


def rebind_problem() -> str | None:
    """What is wrong with ``SLIME_RELOADABLE_PG_REBIND``, if anything (unset is fine)."""
    try:
        parse_prefixes(rebind_prefixes())
    except (TypeError, ValueError) as error:
        return f"{REBIND_ENV}: {error}; sweeping the default prefixes instead"
    return None


def valid_rebind_prefixes() -> str | None:
    """The prefixes the patch sweeps: the variable's when valid, else the default (None)."""
    return None if rebind_problem() is not None else rebind_prefixes()


def watched_rebind_prefixes() -> tuple[str, ...]:
    """The prefixes whose modules are swept as each finishes importing: only those named
    explicitly and validly (``*`` is swept by the patch itself, every module being loaded or
    torch's by then)."""
    raw = valid_rebind_prefixes()
    if raw is None:
        return ()
    items = parse_prefixes(raw)
    return () if "*" in items else items


def start_up_problems() -> list[tuple[str, str, str | None]]:
    """``(key, line, variable)`` for each bad value, in the order the variables are documented."""
    found = []
    for key, variable, problem in (
        ("log", LOG_ENV, log_level_problem()),
        ("mode", MODE_ENV, reload_mode_problem()),
        ("rebind", REBIND_ENV, rebind_problem()),
    ):
        if problem is not None:
            found.append((key, problem, variable))
    for variable, check in (
        (MIN_FREE_ENV, min_free_problem),
        (EVERY_CALL_ENV, every_call_problem),
        (SUSPEND_TIMEOUT_ENV, suspend_timeout_problem),
        (SUSPEND_MIN_FREED_ENV, suspend_min_freed_problem),
        (FAIL_ENV, failure_problem),
    ):
        problem = check(os.environ.get(variable))
        if problem is not None:  # read again at each step: said here once, where users look
            found.append((variable, problem, variable))
    for number, problem in enumerate(adoption_problems()):
        found.append((f"adopt-{number}", problem, None))
    return found
