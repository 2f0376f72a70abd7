"""What the start-up layer knows about this interpreter: the site directories, every copy of
the package on ``sys.path``, the site files, the gate and the other variables it reads.

The doctor reads this; the start-up path never does (``_reloadpg_autopatch_boot`` imports
``os`` and ``sys`` alone). Each function returns plain data, and the problems it sees in the user's
words, so that the doctor renders and dumps it without knowing how it was found.
"""

from __future__ import annotations

import contextlib
import os
import site
import sys
from pathlib import Path
from typing import Any

import _reloadpg_autopatch_boot as boot

from .. import _env
from . import gate_verdict, pth, status
from . import problems as bad_values


def site_dirs() -> list[str]:
    """The directories site processes here, the user site last."""
    dirs = list(site.getsitepackages())
    user = site.getusersitepackages()
    if isinstance(user, str):
        dirs.append(user)
    return dirs


def _home() -> Path:
    """The directory the running copy of the package was imported from."""
    return Path(__file__).resolve().parent.parent.parent


def _resolved(dirs: list[str]) -> set[Path]:
    found = set()
    for directory in dirs:
        with contextlib.suppress(OSError):
            found.add(Path(directory).resolve())
    return found


def outside_site(dirs: list[str]) -> str | None:
    """The directory this package was imported from, when it holds the package's ``.pth`` but
    is no site directory (``pip install --target DIR`` with ``PYTHONPATH=DIR``), else None."""
    home = _home()
    if home in _resolved(dirs) or not (home / pth.PTH_NAME).is_file():
        return None
    return str(home)


def copies(dirs: list[str]) -> list[dict[str, Any]]:
    """Each directory on ``sys.path`` that holds the package, in import order, with whether
    its ``.pth`` is beside it, whether site processes that directory (then the ``.pth`` runs
    in every process), and whether it is the copy that runs here (an editable install maps
    the copy that runs from a directory that need not be on ``sys.path``)."""
    home = _home()
    sites = _resolved(dirs)
    found: dict[Path, dict[str, Any]] = {}
    for entry in [*sys.path, str(home)]:
        with contextlib.suppress(OSError):
            directory = Path(entry or os.getcwd()).resolve()
            if (
                directory in found
                or not (directory / "reloadpg_autopatch" / "__init__.py").is_file()
            ):
                continue
            found[directory] = {
                "path": str(directory),
                "pth": (directory / pth.PTH_NAME).is_file(),
                "site": directory in sites,
                "runs": directory == home,
                "on_sys_path": entry != str(home) or str(home) in sys.path,
            }
    return list(found.values())


def describe_copy(copy: dict[str, Any]) -> str:
    """One copy of ``copies()`` in words: where, whether it runs, and its ``.pth``."""
    runs = "runs" if copy["runs"] else "shadowed, never imported"
    where = "" if copy["on_sys_path"] else ", mapped by an editable install"
    if copy["pth"]:
        pth_state = f"{pth.PTH_NAME} beside it" + (
            ", which site runs in every process" if copy["site"] else ""
        )
    else:
        pth_state = f"no {pth.PTH_NAME}"
    return f"{copy['path']} ({runs}{where}; {pth_state})"


def site_file(name: str, expected: str, dirs: list[str]) -> dict[str, Any]:
    """Whether the site file ``name`` is in one of ``dirs``, and whether it reads ``expected``."""
    for directory in dirs:
        path = Path(directory, name)
        if path.is_file():
            try:
                current = path.read_text(encoding="utf-8") == expected
            except OSError:
                current = False
            return {
                "installed": True,
                "path": str(path),
                "current": current,
                "on_sys_path": directory in sys.path,
            }
    return {"installed": False, "path": None, "current": False, "on_sys_path": False}


def install(site_processing: bool) -> tuple[dict[str, Any], list[str], list[str]]:
    """The site directories, the copies of the package and its two site files; then the notes
    and the problems they make."""
    dirs = site_dirs()
    found = copies(dirs)
    facts = {
        "site_dirs": dirs,
        "copies": found,
        "pth": site_file(pth.PTH_NAME, pth.render_pth(), dirs),
        "start": site_file(pth.START_NAME, pth.render_start(), dirs),
    }
    notes: list[str] = []
    problems: list[str] = []
    if len(found) > 1:
        problems.append(
            f"reloadpg_autopatch is installed {len(found)} times on sys.path: "
            f"{'; '.join(describe_copy(c) for c in found)}. Only the first is "
            "imported, while every .pth site finds runs, whatever version it is: uninstall the "
            "copies that do not run (pip uninstall --user reloadpg_autopatch for the user site, "
            "or pip uninstall with that environment's pip)"
        )
    if not site_processing:
        notes.append(
            f"site processing is off (python -S): {pth.PTH_NAME} was not processed in this "
            "interpreter"
        )
    line, start = facts["pth"], facts["start"]
    elsewhere = outside_site(dirs)
    if not line["installed"] and elsewhere is not None:
        notes.append(
            f"the package is installed in {elsewhere}, where site never runs "
            f"{pth.PTH_NAME} (pip install --target, or PYTHONPATH): the gate cannot activate it"
        )
    elif not line["installed"]:
        notes.append(
            f"{pth.PTH_NAME} is not in this interpreter's site-packages "
            f"({', '.join(dirs)}): install the package into this environment"
        )
    elif not line["current"]:
        problems.append(f"{line['path']} differs from this version's line: reinstall the package")
    if line["installed"] and not start["installed"]:
        problems.append(f"{pth.START_NAME} is missing next to {line['path']}")
    return facts, notes, problems


# ---- the gate and the variables beside it ----------------------------------------------------


def gate() -> tuple[dict[str, Any], list[str]]:
    """``SLIME_RELOADABLE_PG``, its value and the verdict on it (on, off, invalid)."""
    raw = os.environ.get(_env.GATE)
    on, problem = gate_verdict(raw)
    verdict = "on" if on else ("invalid" if problem else "off")
    return {"variable": _env.GATE, "value": raw, "verdict": verdict}, [problem] if problem else []


#: The variables the package reads besides the gate and the adoption's, in the doctor's order.
OPTIONS = (
    _env.LOG_ENV,
    _env.REBIND_ENV,
    _env.MODE_ENV,
    _env.MIN_FREE_ENV,
    _env.SUSPEND_MIN_FREED_ENV,
    _env.EVERY_CALL_ENV,
    _env.SUSPEND_TIMEOUT_ENV,
    _env.FAIL_ENV,
)


def options() -> tuple[dict[str, str | None], list[str]]:
    """Each variable of ``OPTIONS`` as set here, and a problem for each value not understood,
    saying what the package does instead."""
    values = {name: os.environ.get(name) for name in OPTIONS}
    problems = []
    timeout = values[_env.SUSPEND_TIMEOUT_ENV]
    if timeout is not None and timeout.strip():
        try:
            _env.parse_suspend_timeout(timeout)
        except ValueError as error:
            problems.append(f"{error}; the watchdog uses WORLD's timeout")
    every = values[_env.EVERY_CALL_ENV]
    if every is not None and every.strip().lower() not in (*_env.ON_VALUES, *_env.OFF_VALUES):
        problems.append(
            f"{_env.EVERY_CALL_ENV}={_env.excerpt(every)} is not understood; accepted: "
            f"{', '.join(_env.ON_VALUES)} (on) or unset, {', '.join(_env.OFF_VALUES[1:])} (off)"
        )
    failure = _env.failure_problem(values[_env.FAIL_ENV])
    if failure is not None:
        problems.append(failure)
    min_free = values[_env.MIN_FREE_ENV]
    if min_free is not None and min_free.strip():
        try:
            _env.parse_min_free_gb(min_free)
        except ValueError as error:
            problems.append(f"{error}; the guard uses its default, 3 GiB")
    share = values[_env.SUSPEND_MIN_FREED_ENV]
    if share is not None and share.strip():
        try:
            _env.parse_suspend_min_freed(share)
        except ValueError as error:
            problems.append(
                f"{error}; auto mode uses the default, {_env.DEFAULT_SUSPEND_MIN_FREED:g}"
            )
    problems += [p for p in (bad_values.reload_mode_problem(), bad_values.log_level_problem()) if p]
    rebind = values[_env.REBIND_ENV]
    if rebind and rebind.strip():
        try:
            _env.parse_prefixes(rebind)
        except (TypeError, ValueError) as error:
            problems.append(f"{_env.REBIND_ENV}: {error}")
    return values, problems


def adoption_options() -> tuple[dict[str, str | None], list[str]]:
    """The adoption's two variables as set here, and what is wrong with their values."""
    values = {name: os.environ.get(name) for name in (_env.ADOPT_ENV, _env.ADOPT_MODULES_ENV)}
    return values, bad_values.adoption_problems()


def activation_problems(install: dict[str, Any], site_processing: bool) -> list[str]:
    """With the gate on: why the ``.pth`` could not have activated the patch at start-up."""
    line = install["pth"]
    elsewhere = outside_site(install["site_dirs"])
    if not site_processing:
        return [
            "site processing is off (python -S): the .pth was not processed, so nothing was "
            "activated at start-up; drop -S or call reloadpg_autopatch.monkey_patch_torch_dist()"
        ]
    if not line["installed"] and elsewhere is not None:
        return [
            f"the gate is on but the package is installed in {elsewhere}, a "
            "directory site never processes (pip install --target, or a directory on "
            f"PYTHONPATH): site runs .pth files only in site-packages, so {pth.PTH_NAME} "
            "there never ran, nothing was activated, and the lifecycle API refuses to run; "
            "install the package into this interpreter's site-packages (pip install without "
            "--target), or call reloadpg_autopatch.monkey_patch_torch_dist() before "
            "torch.distributed is used"
        ]
    if not line["installed"]:
        return [
            f"the gate is on but {pth.PTH_NAME} is not installed in this interpreter's "
            "site-packages: install the package into this environment"
        ]
    if not line["on_sys_path"]:
        return [
            f"the gate is on but {line['path']} is in a site directory this interpreter "
            "skipped (user site-packages under python -s or PYTHONNOUSERSITE, which Ray "
            "workers inherit): install the package into the environment's site-packages"
        ]
    return []


def activation() -> dict[str, object]:
    """What activation did in this process: whether, from where, and what it warned."""
    return status()


def waiting_for(module: str) -> bool:
    """Whether the start-up layer's finder waits for ``module`` (to act when it is imported)."""
    return any(getattr(f, "name", None) == module for f in boot.installed())
