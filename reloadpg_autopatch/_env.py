"""The environment's vocabulary: every variable this package reads and the values it accepts.

It sits below every layer (the start-up layer, the patching, the groups and the tools all read
these names from here), so no lower layer has to import the start-up layer to learn them. It
imports nothing: the ``.pth`` line's start-up path loads it in every process of an image.
"""

TYPE_CHECKING = False  # typing is not loaded at start-up; type checkers read this name
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

#: The gate: the patch is applied at start-up only when it holds one of ``ON_VALUES``.
GATE = "SLIME_RELOADABLE_PG"
#: Module prefixes the rebind sweep visits (comma-separated, or ``*``).
REBIND_ENV = "SLIME_RELOADABLE_PG_REBIND"
#: Level of the ``reloadpg_autopatch`` logger, one of ``LOG_LEVELS``.
LOG_ENV = "SLIME_RELOADABLE_PG_LOG"
#: How reloadable groups reload, one of ``MODES``.
MODE_ENV = "SLIME_RELOADABLE_PG_MODE"
#: Free accelerator memory (GiB) the guard wants before a reloaded group's first collective;
#: ``0`` turns the guard off.
MIN_FREE_ENV = "SLIME_RELOADABLE_PG_MIN_FREE_GB"
#: The guard checks before every collective on an accelerator group, as slime does.
EVERY_CALL_ENV = "SLIME_RELOADABLE_PG_MEMORY_GUARD_EVERY_CALL"
#: Seconds one ``suspend()`` or ``resume()`` may take before the watchdog ends the process
#: (default: WORLD's timeout).
SUSPEND_TIMEOUT_ENV = "SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT"
#: In ``auto`` mode, the share of a communicator's memory a suspend must free (its
#: ``memory_stats()``: ``suspend / total``) for the group to be suspended rather than freed.
SUSPEND_MIN_FREED_ENV = "SLIME_RELOADABLE_PG_SUSPEND_MIN_FREED"
#: Testing only: ``patch`` makes the patch raise, to check that nothing breaks.
FAIL_ENV = "SLIME_RELOADABLE_PG_INJECT_FAILURE"
#: Adopt a framework's lifecycle module (its names point at this package's lifecycle): on by
#: default wherever the package patches; an ``OFF_VALUES`` value keeps the framework's own.
ADOPT_ENV = "SLIME_RELOADABLE_PG_ADOPT"
#: More lifecycle modules to adopt, comma-separated, beside ``ADOPT_MODULES``.
ADOPT_MODULES_ENV = "SLIME_RELOADABLE_PG_ADOPT_MODULES"

#: Every variable above, for tools that list or clear them.
VARIABLES = (
    GATE,
    REBIND_ENV,
    LOG_ENV,
    MODE_ENV,
    MIN_FREE_ENV,
    EVERY_CALL_ENV,
    SUSPEND_TIMEOUT_ENV,
    SUSPEND_MIN_FREED_ENV,
    FAIL_ENV,
    ADOPT_ENV,
    ADOPT_MODULES_ENV,
)

# Gate values, compared after ``strip().lower()``; anything else is reported and means off.
ON_VALUES = ("1", "true", "yes", "on")
OFF_VALUES = ("", "0", "false", "no", "off")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MODES = ("wrapper", "native", "suspend", "auto")

DEFAULT_PREFIXES: tuple[str, ...] = ("megatron",)

#: The frameworks' lifecycle modules adopted by default: slime's, miles' and vime's.
ADOPT_MODULES: tuple[str, ...] = (
    "slime.utils.reloadable_process_group",
    "miles.utils.reloadable_process_group",
    "vime.utils.reloadable_process_group",
)
#: The lifecycle names adoption points at this package's own, where the module defines them.
ADOPTED_NAMES: tuple[str, ...] = (
    "monkey_patch_torch_dist",
    "register_default_process_group",
    "destroy_process_groups",
    "reload_process_groups",
)

#: How much of a user's value a report quotes: enough to recognise it, short enough for a line.
EXCERPT_CHARS = 60


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """``repr`` of a value a user set, cut to ``limit`` characters with its length after it
    (a report echoes what was read; a 128 KB variable must not make a 128 KB line)."""
    if not isinstance(value, str) or len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


#: The memory guard's default threshold, in GiB (slime's).
DEFAULT_MIN_FREE_GB = 3.0
#: The largest threshold accepted, in GiB (1 PiB): more than any device has, so a larger
#: number is a unit mistake (bytes for GiB), and every threshold converts to bytes exactly.
LARGEST_MIN_FREE_GB = float(2**20)


def _number(raw: str, low: float, high: float, *, above: bool = False) -> float | None:
    """``raw`` as a number from ``low`` (excluded with ``above``) to ``high``, else None (not a
    number, NaN, infinite, out of range)."""
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if (low < value if above else low <= value) and value <= high else None


def _problem(raw: "str | None", parse: "Callable[[str], float]", then: str) -> "str | None":
    """The one line for a bad value of a number's variable (unset or empty is fine)."""
    if raw is None or not raw.strip():
        return None
    try:
        parse(raw)
    except ValueError as error:
        return f"{error}; {then}"
    return None


def parse_min_free_gb(raw: str) -> float:
    """``SLIME_RELOADABLE_PG_MIN_FREE_GB``'s value as GiB; ``ValueError`` names what is accepted."""
    value = _number(raw, 0.0, LARGEST_MIN_FREE_GB)
    if value is None:
        raise ValueError(
            f"{MIN_FREE_ENV}={excerpt(raw)} is not a number of GiB; accepted: 0 (the memory "
            f"guard off) or a positive number up to {LARGEST_MIN_FREE_GB:.0f}, such as 3 or 1.5"
        )
    return value


def min_free_problem(raw: "str | None") -> "str | None":
    """The one line for a bad ``SLIME_RELOADABLE_PG_MIN_FREE_GB`` (unset or empty is fine)."""
    return _problem(raw, parse_min_free_gb, f"using the default, {DEFAULT_MIN_FREE_GB:g} GiB")


def every_call_problem(raw: "str | None") -> "str | None":
    """The one line for a bad ``SLIME_RELOADABLE_PG_MEMORY_GUARD_EVERY_CALL`` (unset is fine)."""
    if raw is None or raw.strip().lower() in ON_VALUES + OFF_VALUES:
        return None
    off = ", ".join(repr(v) for v in OFF_VALUES)
    return (
        f"{EVERY_CALL_ENV}={excerpt(raw)} is not understood; accepted: {', '.join(ON_VALUES)} "
        f"(on) or {off} (off); the guard checks once per group after each reload"
    )


def parse_seconds(raw: str, variable: str, longest: float | None = None) -> float:
    """A positive number of seconds from ``variable``, at most ``longest`` (what the reader can
    time); ``ValueError`` names what is accepted."""
    value = _number(raw, 0.0, 1e300 if longest is None else longest, above=True)
    if value is None:
        most = "" if longest is None else f" up to {longest:g}"
        raise ValueError(
            f"{variable}={excerpt(raw)} is not a number of seconds the watchdog can time; "
            f"accepted: a positive number{most}, such as 600 or 1.5"
        )
    return value


#: The longest ``SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT`` accepted, in seconds (about 31 years):
#: well within what a thread can wait on every 64-bit platform (``threading.TIMEOUT_MAX``).
LONGEST_SUSPEND_TIMEOUT_S = 1e9


def parse_suspend_timeout(raw: str) -> float:
    """``SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT``'s value in seconds; ``ValueError`` names what is
    accepted."""
    return parse_seconds(raw, SUSPEND_TIMEOUT_ENV, LONGEST_SUSPEND_TIMEOUT_S)


#: ``SLIME_RELOADABLE_PG_SUSPEND_MIN_FREED`` when unset: a suspend keeping most is not worth it.
DEFAULT_SUSPEND_MIN_FREED = 0.5


def parse_suspend_min_freed(raw: str) -> float:
    """``SLIME_RELOADABLE_PG_SUSPEND_MIN_FREED``'s value, a share from 0 to 1; ``ValueError``
    names what is accepted."""
    value = _number(raw, 0.0, 1.0)
    if value is None:
        raise ValueError(
            f"{SUSPEND_MIN_FREED_ENV}={excerpt(raw)} is not a share of a communicator's memory; "
            "accepted: a number from 0 (always suspend) to 1, such as 0.5 (the default)"
        )
    return value


def suspend_min_freed_problem(raw: "str | None") -> "str | None":
    """The one line for a bad ``SLIME_RELOADABLE_PG_SUSPEND_MIN_FREED`` (unset or empty is fine)."""
    return _problem(raw, parse_suspend_min_freed, f"using {DEFAULT_SUSPEND_MIN_FREED:g} instead")


def suspend_timeout_problem(raw: "str | None") -> "str | None":
    """The one line for a bad ``SLIME_RELOADABLE_PG_SUSPEND_TIMEOUT`` (unset or empty is fine)."""
    return _problem(raw, parse_suspend_timeout, "using WORLD's timeout instead")


#: The entry point group through which an installed distribution registers a mode: each entry
#: point is named for its mode, and importing its target registers the mode's way
#: (``ways.register(way, mode=name)``).
MODES_GROUP = "reloadpg_autopatch.modes"


def mode_problem(raw: str | None, plugins: "Iterable[str]" = ()) -> str | None:
    """What is wrong with a ``SLIME_RELOADABLE_PG_MODE`` value, if anything (unset is fine);
    ``plugins``: the modes installed distributions register (``MODES_GROUP``)."""
    value = (raw or "").strip()
    there = [*MODES, *plugins]
    if not value or value.lower() in MODES or value in plugins:
        return None
    return (
        f"{MODE_ENV}={excerpt(value)} is not a mode; use one of {', '.join(there)}, or one a "
        f"plugin registers (entry point group {MODES_GROUP}); wrapper is used"
    )


#: ``SLIME_RELOADABLE_PG_INJECT_FAILURE``'s values: where a failure is injected.
FAILURES = ("patch",)


def failure_problem(raw: str | None) -> str | None:
    """What is wrong with a ``SLIME_RELOADABLE_PG_INJECT_FAILURE`` value (unset is fine)."""
    value = (raw or "").strip().lower()
    if not value or value in FAILURES:
        return None
    return (
        f"{FAIL_ENV}={excerpt(raw)} is not understood and injects nothing; accepted: "
        f"{', '.join(FAILURES)} (testing only: the patch raises), or unset"
    )


#: ``(variable, value)`` pairs already reported in this process (``first_report``).
_REPORTED: set[tuple[str, str]] = set()


def first_report(variable: str, raw: str) -> bool:
    """Whether this process meets this bad value of ``variable`` for the first time: every
    reader reports through this, so a process says it once, whichever layer read it first; a
    forked child inherits what its parent said."""
    key = (variable, raw)
    if key in _REPORTED:
        return False
    _REPORTED.add(key)
    return True


def parse_prefixes(prefixes: "str | Iterable[str] | None") -> tuple[str, ...]:
    """Normalise a prefix spec: None (the default), ``"*"``, ``"a,b"`` or an iterable of names
    (the one parser of ``SLIME_RELOADABLE_PG_REBIND``, for the start-up watcher and the sweep)."""
    if prefixes is None:
        return DEFAULT_PREFIXES
    items = prefixes.split(",") if isinstance(prefixes, str) else list(prefixes)
    out = []
    for raw in items:
        if not isinstance(raw, str):
            raise TypeError(
                "rebind prefixes must be module names (str), '*' or a comma-separated "
                f"string; got {excerpt(raw)}"
            )
        item = raw.strip()
        if not item:
            continue
        if item != "*" and not all(part.isidentifier() for part in item.split(".")):
            raise ValueError(
                f"rebind prefix {excerpt(item)} is not a module name; use dotted names like "
                "'megatron' or 'megatron.core', or '*' for every module"
            )
        out.append(item)
    if not out:
        raise ValueError("rebind prefixes are empty; use module names such as 'megatron', or '*'")
    return tuple(out)


def parse_adopt(raw: "str | None") -> bool:
    """``SLIME_RELOADABLE_PG_ADOPT``: True (adopt; also unset or empty) or False (keep the
    framework's own lifecycle). ``ValueError`` names what is accepted."""
    value = (raw or "").strip().lower()
    if not value or value in ON_VALUES:
        return True
    if value in OFF_VALUES:
        return False
    raise ValueError(
        f"{ADOPT_ENV}={excerpt(raw)} is not understood, so no framework's lifecycle is adopted "
        f"(each keeps its own); use one of {', '.join(ON_VALUES)} (or unset: adopt, the "
        f"default) or {', '.join(OFF_VALUES[1:])} (keep the framework's own)"
    )


def parse_adopt_modules(raw: "str | None") -> tuple[tuple[str, ...], list[str]]:
    """``SLIME_RELOADABLE_PG_ADOPT_MODULES``: ``(modules to adopt, problems)``: the modules are
    ``ADOPT_MODULES`` and the value's dotted names; each other name is a problem, left out."""
    modules = list(ADOPT_MODULES)
    problems = []
    for item in (raw or "").split(","):
        name = item.strip()
        if not name:
            continue
        if not all(part.isidentifier() for part in name.split(".")):
            problems.append(
                f"{ADOPT_MODULES_ENV}: {excerpt(name)} is not a module name, so it is left out; "
                "use dotted names such as 'myfork.utils.reloadable_process_group'"
            )
        elif name not in modules:
            modules.append(name)
    return tuple(modules), problems
