"""``python -m reloadpg_autopatch doctor``: say exactly what is and is not patched, and why.

Every check is a fact of *this* interpreter (its site-packages, its flags, its environment),
so run the doctor with the same Python and the same variables as the training process, for
example inside the Ray ``runtime_env`` or the training image.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import site
import sys
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__, _env, _startup
from .._env import excerpt
from .._startup import problems as startup_problems
from .._startup import pth


@dataclass
class Report:
    """Everything the doctor found; ``problems`` decides the exit code."""

    version: str = __version__
    python: str = ""
    executable: str = ""
    site_processing: bool = True
    site_dirs: list[str] = field(default_factory=list)
    pth: dict[str, Any] = field(default_factory=dict)
    start: dict[str, Any] = field(default_factory=dict)
    #: Every copy of the package on ``sys.path`` (and the one that runs, wherever it is).
    copies: list[dict[str, Any]] = field(default_factory=list)
    gate: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    activation: dict[str, Any] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)
    torch: dict[str, Any] = field(default_factory=dict)
    stale: list[dict[str, str]] = field(default_factory=list)
    forwarding: dict[str, list[str]] = field(default_factory=dict)
    fidelity: dict[str, Any] = field(default_factory=dict)
    #: The memory guard, the reload hooks and the last cycle report of this process.
    cycle: dict[str, Any] = field(default_factory=dict)
    #: Which lifecycle the frameworks' calls reach: each lifecycle module, adopted or its own.
    adoption: dict[str, Any] = field(default_factory=dict)
    #: The groups torch knows that no cycle frees or brings back, and why (a live process).
    left_alone: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if self.problems:
            return "problems found"
        return "healthy" if self.torch.get("patched") else "healthy, inactive (gate off)"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdict"] = self.verdict
        return data


def _site_dirs() -> list[str]:
    dirs = list(site.getsitepackages())
    user = site.getusersitepackages()
    if isinstance(user, str):
        dirs.append(user)
    return dirs


def _installed_file(name: str, expected: str, report: Report) -> dict[str, Any]:
    for directory in report.site_dirs:
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


def _outside_site(report: Report) -> str | None:
    """The directory this package was imported from, when it holds the package's ``.pth`` but
    is no site directory (``pip install --target DIR`` with ``PYTHONPATH=DIR``), else None."""
    home = Path(__file__).resolve().parent.parent.parent
    sites = set()
    for directory in report.site_dirs:
        with contextlib.suppress(OSError):
            sites.add(Path(directory).resolve())
    if home in sites or not (home / pth.PTH_NAME).is_file():
        return None
    return str(home)


def _copies(report: Report) -> list[dict[str, Any]]:
    """Each directory on ``sys.path`` that holds the package, in import order, with whether
    its ``.pth`` is beside it, whether site processes that directory (then the ``.pth`` runs
    in every process), and whether it is the copy that runs here (an editable install maps
    the copy that runs from a directory that need not be on ``sys.path``)."""
    home = Path(__file__).resolve().parent.parent.parent
    sites = set()
    for directory in report.site_dirs:
        with contextlib.suppress(OSError):
            sites.add(Path(directory).resolve())
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


def _describe_copy(copy: dict[str, Any]) -> str:
    runs = "runs" if copy["runs"] else "shadowed, never imported"
    where = "" if copy["on_sys_path"] else ", mapped by an editable install"
    if copy["pth"]:
        pth_state = f"{pth.PTH_NAME} beside it" + (
            ", which site runs in every process" if copy["site"] else ""
        )
    else:
        pth_state = f"no {pth.PTH_NAME}"
    return f"{copy['path']} ({runs}{where}; {pth_state})"


def _check_install(report: Report) -> None:
    report.site_dirs = _site_dirs()
    report.copies = _copies(report)
    if len(report.copies) > 1:
        report.problems.append(
            f"reloadpg_autopatch is installed {len(report.copies)} times on sys.path: "
            f"{'; '.join(_describe_copy(c) for c in report.copies)}. Only the first is "
            "imported, while every .pth site finds runs, whatever version it is: uninstall the "
            "copies that do not run (pip uninstall --user reloadpg_autopatch for the user site, "
            "or pip uninstall with that environment's pip)"
        )
    if not report.site_processing:
        report.notes.append(
            f"site processing is off (python -S): {pth.PTH_NAME} was not processed in this "
            "interpreter"
        )
    report.pth = _installed_file(pth.PTH_NAME, pth.render_pth(), report)
    report.start = _installed_file(pth.START_NAME, pth.render_start(), report)
    if not report.pth["installed"] and _outside_site(report) is not None:
        report.notes.append(
            f"the package is installed in {_outside_site(report)}, where site never runs "
            f"{pth.PTH_NAME} (pip install --target, or PYTHONPATH): the gate cannot activate it"
        )
    elif not report.pth["installed"]:
        report.notes.append(
            f"{pth.PTH_NAME} is not in this interpreter's site-packages "
            f"({', '.join(report.site_dirs)}): install the package into this environment"
        )
    elif not report.pth["current"]:
        report.problems.append(
            f"{report.pth['path']} differs from this version's line: reinstall the package"
        )
    if report.pth["installed"] and not report.start["installed"]:
        report.problems.append(f"{pth.START_NAME} is missing next to {report.pth['path']}")


def _check_gate(report: Report) -> None:
    raw = os.environ.get(_env.GATE)
    on, problem = _startup.gate_verdict(raw)
    verdict = "on" if on else ("invalid" if problem else "off")
    report.gate = {"variable": _env.GATE, "value": raw, "verdict": verdict}
    if problem:
        report.problems.append(problem)
    log = os.environ.get(_env.LOG_ENV)
    rebind = os.environ.get(_env.REBIND_ENV)
    report.options = {
        _env.LOG_ENV: log,
        _env.REBIND_ENV: rebind,
        _env.MODE_ENV: os.environ.get(_env.MODE_ENV),
        _env.MIN_FREE_ENV: os.environ.get(_env.MIN_FREE_ENV),
        _env.SUSPEND_MIN_FREED_ENV: os.environ.get(_env.SUSPEND_MIN_FREED_ENV),
        _env.EVERY_CALL_ENV: os.environ.get(_env.EVERY_CALL_ENV),
        _env.SUSPEND_TIMEOUT_ENV: os.environ.get(_env.SUSPEND_TIMEOUT_ENV),
        _env.FAIL_ENV: os.environ.get(_env.FAIL_ENV),
    }
    timeout = os.environ.get(_env.SUSPEND_TIMEOUT_ENV)
    if timeout is not None and timeout.strip():
        try:
            _env.parse_suspend_timeout(timeout)
        except ValueError as error:
            report.problems.append(f"{error}; the watchdog uses WORLD's timeout")
    every = os.environ.get(_env.EVERY_CALL_ENV)
    if every is not None and every.strip().lower() not in (*_env.ON_VALUES, *_env.OFF_VALUES):
        report.problems.append(
            f"{_env.EVERY_CALL_ENV}={_env.excerpt(every)} is not understood; accepted: "
            f"{', '.join(_env.ON_VALUES)} (on) or unset, {', '.join(_env.OFF_VALUES[1:])} (off)"
        )
    failure = _env.failure_problem(os.environ.get(_env.FAIL_ENV))
    if failure is not None:
        report.problems.append(failure)
    min_free = os.environ.get(_env.MIN_FREE_ENV)
    if min_free is not None and min_free.strip():
        try:
            _env.parse_min_free_gb(min_free)
        except ValueError as error:
            report.problems.append(f"{error}; the guard uses its default, 3 GiB")
    share = os.environ.get(_env.SUSPEND_MIN_FREED_ENV)
    if share is not None and share.strip():
        try:
            _env.parse_suspend_min_freed(share)
        except ValueError as error:
            report.problems.append(
                f"{error}; auto mode uses the default, {_env.DEFAULT_SUSPEND_MIN_FREED:g}"
            )
    mode_problem = startup_problems.reload_mode_problem()
    if mode_problem is not None:
        report.problems.append(mode_problem)
    log_problem = startup_problems.log_level_problem()
    if log_problem is not None:
        report.problems.append(log_problem)
    if rebind and rebind.strip():
        try:
            _env.parse_prefixes(rebind)
        except (TypeError, ValueError) as error:
            report.problems.append(f"{_env.REBIND_ENV}: {error}")
    if not on:
        return
    if not report.site_processing:
        report.problems.append(
            "site processing is off (python -S): the .pth was not processed, so nothing was "
            "activated at start-up; drop -S or call reloadpg_autopatch.monkey_patch_torch_dist()"
        )
    elif not report.pth["installed"] and _outside_site(report) is not None:
        report.problems.append(
            f"the gate is on but the package is installed in {_outside_site(report)}, a "
            "directory site never processes (pip install --target, or a directory on "
            f"PYTHONPATH): site runs .pth files only in site-packages, so {pth.PTH_NAME} "
            "there never ran, nothing was activated, and the lifecycle API refuses to run; "
            "install the package into this interpreter's site-packages (pip install without "
            "--target), or call reloadpg_autopatch.monkey_patch_torch_dist() before "
            "torch.distributed is used"
        )
    elif not report.pth["installed"]:
        report.problems.append(
            f"the gate is on but {pth.PTH_NAME} is not installed in this interpreter's "
            "site-packages: install the package into this environment"
        )
    elif not report.pth["on_sys_path"]:
        report.problems.append(
            f"the gate is on but {report.pth['path']} is in a site directory this interpreter "
            "skipped (user site-packages under python -s or PYTHONNOUSERSITE, which Ray "
            "workers inherit): install the package into the environment's site-packages"
        )


def _check_torch(report: Report, imports: list[str]) -> None:
    for name in imports:
        try:
            importlib.import_module(name)
            report.imports[name] = "ok"
        except Exception as error:  # any import error is the user's to see, not ours to raise
            report.imports[name] = f"{type(error).__name__}: {error}"
            report.problems.append(f"--import {name} failed: {type(error).__name__}: {error}")
    try:
        import torch
        import torch.distributed as dist
    except Exception as error:
        report.torch = {"version": None, "patched": False}
        if isinstance(error, ModuleNotFoundError) and error.name == "torch":
            _torch_absent(report)
        else:
            report.problems.append(
                f"cannot import torch.distributed: {type(error).__name__}: {error}"
            )
        return
    from ..patching import patchset

    report.activation = _startup.status()
    patched = patchset.is_patched()
    report.torch = {
        "version": torch.__version__,
        "distributed_available": dist.is_available(),
        "patched": patched,
        "patched_functions": patchset.patched_names(),
        "outer_patch_on_new_group": patched
        and dist.new_group is not patchset.current().wrappers["new_group"],
    }
    if report.gate.get("verdict") == "on" and not patched and report.site_processing:
        report.problems.append(
            "the gate is on but torch.distributed is not patched: the .pth line did not run "
            "or the patch failed (see the line it printed on stderr)"
        )
    if patched:
        from ..patching.sweep import find_stale

        for item in find_stale("*"):
            report.stale.append({"module": item.module, "attribute": item.attribute})
        if report.stale:
            names = ", ".join(f"{s['module']}.{s['attribute']}" for s in report.stale[:10])
            report.problems.append(
                f"{len(report.stale)} stale reference(s) still hold torch's unpatched "
                f"functions: {names}; add their packages to {_env.REBIND_ENV} or call "
                "reloadpg_autopatch.rebind([...]) after importing them"
            )
    if dist.is_available():
        from ..groups.ways.wrapper.group import forwarding_report

        report.forwarding = forwarding_report()
        _check_mode(report)
    if patched:
        _check_fidelity(report)
        _check_cycle(report)


def _check_mode(report: Report) -> None:
    """The reload mode in force, and for each backend in use here which action applies and why.

    The answers come from the one choice the lifecycle decides with (``ways``), asked of this
    process's groups, so the doctor cannot tell another story.
    """
    import torch
    import torch.distributed as dist

    from ..groups import implementations, lifecycle, mode
    from ..groups.ways import inplace, suspend
    from ..groups.ways.wrapper import ReloadableProcessGroup

    chosen = mode.get_reload_mode()
    backends: dict[str, str] = {}
    held = [dist.GroupMember.WORLD] if dist.is_initialized() else []
    held += lifecycle.reloadable_groups()
    for each in held:
        # The native group, also behind a wrapper that sleeps (its record keeps it).
        group = each
        if isinstance(each, ReloadableProcessGroup):
            group = each.group or each._record.native
        if group is None:
            continue  # destroyed behind its wrapper: no backend to ask until the reload
        try:
            name = str(dist.get_backend(group))
        except Exception:  # torch no longer knows it (its WORLD ended): its C++ name
            name = str(group._get_backend_name())
        if name not in backends:
            backends[name] = _action(report, name, group)
    if not inplace.torch_can_reconfigure() and chosen != "wrapper":
        why = inplace.in_place_refusal(None)
        backends.setdefault("every other backend", f"behind a wrapper: {why}")
    report.fidelity["mode"] = {
        "mode": chosen,
        "variable": os.environ.get(_env.MODE_ENV),
        "backends": backends,
    }
    default = dist.GroupMember.WORLD if dist.is_initialized() else None
    in_use = _nccl(report, default)
    if chosen in ("suspend", "auto"):
        warnings = [w for w in (suspend.environment_refusal(),) if w]
        unbound = getattr(default, "bound_device_id", None) is None
        if implementations.CLASSIC in in_use and unbound:
            warnings.append(
                "WORLD has no device_id: the classic ProcessGroupNCCL creates p2p "
                "communicators lazily, which suspend neither frees nor counts; pass device_id "
                "to init_process_group"
            )
        if in_use and os.environ.get("NCCL_NVLS_ENABLE", "").strip() != "0":
            warnings.append(
                "NVLS buffers stay resident while asleep (NCCL_NVLS_ENABLE=0 frees more on "
                "NVSwitch nodes)"
            )
        if implementations.NCCL2 in in_use:
            warnings.append(
                "nccl2 makes each new group's communicator by splitting WORLD's at creation: "
                "no group is created while WORLD sleeps (new_group, split_group and "
                "shrink_group raise GroupSuspendedError until reload_process_groups())"
            )
        if implementations.LAZY in in_use or "nccl-lazy" in backends:
            warnings.append(
                "nccl-lazy suspends its pair communicators in map order, which may not match "
                "across ranks"
            )
        versions = {}
        for getter in ("get_build_nccl_version", "get_runtime_nccl_version"):
            call = getattr(getattr(dist, "ProcessGroupNCCL", None), getter, None)
            try:
                versions[getter] = ".".join(map(str, call())) if call else None
            except Exception:
                versions[getter] = None
        report.fidelity["suspend"] = {
            "torch": torch.__version__,
            "available": suspend.torch_can_suspend(),
            "guard": "pre-hook" if suspend.torch_has_pre_hooks() else "wrapper",
            "nccl_build": versions["get_build_nccl_version"],
            "nccl_runtime": versions["get_runtime_nccl_version"],
            "warnings": warnings,
            "resident_always": "inter-node network buffers and NVLS buffers stay resident",
            "auto": _auto_frees() if chosen == "auto" else None,
        }


def _auto_frees() -> str:
    """What ``auto`` mode frees instead of suspending (``ways.candidates_for``, the share)."""
    from ..groups.ways.suspend.capability import min_freed_share

    share = min_freed_share()
    return (
        "one-rank groups are freed and made again, never suspended (a suspend keeps their "
        f"network buffer); a group whose suspend would free less than {share:.0%} of its "
        f"memory ({_env.SUSPEND_MIN_FREED_ENV}) is freed instead; the last cycle report names "
        "them (freed, not suspended)"
    )


def _nccl(report: Report, world: Any) -> set[str]:
    """What ``nccl`` resolves to here and what serves WORLD; returns the NCCL implementations
    in use (WORLD's backends as they answer; where WORLD's backends do not answer and its
    backend names ``nccl``, what that name resolves to)."""
    import torch.distributed as dist

    from ..groups import implementations
    from ..groups.backends import component_names

    info = implementations.resolution()
    # The native WORLD, also behind its stand-in while it sleeps (its record keeps it).
    native = getattr(world, "group", None) or getattr(
        getattr(world, "_record", None), "native", None
    )
    native = native if native is not None else world
    legs = implementations.of_group(native) if native is not None else []
    info["world"] = legs
    report.fidelity["nccl"] = info
    nccl = set(implementations.CLASSES)
    in_use = {leg["implementation"] for leg in legs} & nccl
    if world is not None and not legs:
        try:
            names = component_names(dist.get_backend())
        except Exception:  # torch no longer knows WORLD
            names = ()
        if "nccl" in names:
            in_use.add(info["resolves_to"])
        in_use |= {implementations.BY_NAME[n] for n in names if n in ("nccl2", "nccl-lazy")}
    return in_use


def _action(report: Report, name: str, group: Any) -> str:
    """What the mode in force does with a group of backend ``name``, and why (``ways``)."""
    from ..groups import ways

    text, problem = ways.explain(group, name)
    if problem is not None:
        report.problems.append(problem)
    return text


def _check_fidelity(report: Report) -> None:
    """Whether each mechanism that keeps torch from telling our groups apart is in place."""
    import sys as _sys

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from .._startup import finder
    from ..groups import aliases, lifecycle
    from ..patching import dynamo, patchset

    patch = patchset.current()
    in_c10d = sorted(n for n in patch.installed if n in patch.c10d)
    displaced = [n for n in in_c10d if getattr(c10d, n, None) is not patch.c10d[n]]
    report.fidelity["c10d"] = {
        "installed": len(in_c10d),
        "namespace_only": sorted(patch.installed - set(patch.c10d)),
        "displaced": displaced,
    }
    if displaced:
        report.problems.append(
            "distributed_c10d no longer holds our wrappers of: " + ", ".join(displaced)
        )
    if dynamo.MODULE in _sys.modules:
        remaps = dynamo.report()
        report.fidelity["compile"] = {"loaded": True, **remaps}
        if remaps["missing"]:
            report.problems.append(
                "torch.compile does not know our wrappers of "
                + ", ".join(remaps["missing"])
                + ": fullgraph compilation of them fails; patch before compiling anything"
            )
    else:
        waiting = any(getattr(f, "name", None) == dynamo.MODULE for f in finder.installed())
        report.fidelity["compile"] = {"loaded": False, "waiting": waiting}
        if patch.complete and not waiting:
            report.problems.append(
                f"{dynamo.MODULE} is not loaded and nothing waits for it: torch.compile will "
                "not know our wrappers"
            )
    live = lifecycle.reloadable_groups()
    wrong = []
    for group in live:
        native = getattr(group, "group", None)
        if native is None:  # in place (no wrapper), or destroyed right now
            continue
        name = str(native.group_name)
        try:
            resolved = c10d._resolve_process_group(name)
        except RuntimeError as error:
            wrong.append(f"{name!r} does not resolve: {error}")
            continue
        if resolved is not group and resolved is not native:
            wrong.append(f"{name!r} resolves to another group")
        if group not in c10d._world.pg_group_ranks:
            wrong.append(f"{name!r} is unknown to torch's maps")
    report.fidelity["groups"] = {
        "reloadable": len(live),
        "aliases": aliases.count(),
        "maps_answer_for_wrappers": aliases.installed() or not live,
        "inconsistent": wrong,
    }
    if wrong:
        report.problems.append("group names or maps are inconsistent: " + "; ".join(wrong))
    report.fidelity["initialized"] = dist.is_initialized()


def _check_cycle(report: Report) -> None:
    """The guard's settings, the hooks, and in a live process the last cycle's report."""
    from ..groups import guard as memory_guard
    from ..groups import hooks, memory, releases
    from ..groups.lifecycle import last_cycle_report

    guard = memory_guard.get_memory_guard()
    last = last_cycle_report()
    report.cycle = {
        "guard": {
            "min_free_gb": guard.min_free_gb,
            "every_call": guard.every_call,
            "probe": "torch" if memory.probe_is_default() else "custom",
        },
        "hooks": hooks.registered(),
        "releases": releases.describe(),
        "last": last.to_dict() if last is not None else None,
    }


def _check_adoption(report: Report) -> None:
    """Which lifecycle the program's calls reach: for each framework's lifecycle module imported
    here, adopted (its names call the package's) or its own, and why; which modules bind the
    lifecycle names, and to whose; and a mode that would never run because a framework keeps
    its own lifecycle."""
    raw = os.environ.get(_env.ADOPT_ENV)
    report.options[_env.ADOPT_ENV] = raw
    report.options[_env.ADOPT_MODULES_ENV] = os.environ.get(_env.ADOPT_MODULES_ENV)
    report.problems.extend(startup_problems.adoption_problems())
    watched = _env.parse_adopt_modules(os.environ.get(_env.ADOPT_MODULES_ENV))[0]
    loaded = [name for name in watched if name in sys.modules]
    try:
        on, problem = _env.parse_adopt(raw), None
    except ValueError as error:
        on, problem = False, str(error)
    report.adoption = {
        "variable": raw,
        "on": on,
        "problem": problem,
        "modules": list(watched),
        "seen": [],
        "callers": {},
    }
    if not report.torch.get("patched"):
        report.adoption["seen"] = [
            {"module": name, "adopted": [], "kept": "torch.distributed is not patched here"}
            for name in loaded
        ]
        return
    from ..adoption import seen as adoption
    from ..groups import mode

    status = adoption.status()
    report.adoption["seen"] = status["seen"]
    seen = {entry["module"] for entry in status["seen"]}
    for name in loaded:
        if name not in seen:
            report.adoption["seen"].append(
                {"module": name, "adopted": [], "kept": "not handed to the adoption yet"}
            )
    report.adoption["callers"] = _lifecycle_callers(seen)
    chosen = mode.get_reload_mode()
    kept = [entry for entry in report.adoption["seen"] if entry["kept"]]
    if chosen != "wrapper":
        for entry in kept:
            report.problems.append(
                f"{_env.MODE_ENV}={chosen} is chosen, but {entry['module']} keeps its own "
                f"lifecycle ({entry['kept']}): its destroy_process_groups() and "
                f"reload_process_groups() never reach this package, so the {chosen} mode would "
                f"never run; let the package adopt it (unset {_env.ADOPT_ENV}) or use wrapper"
            )


def _check_left_alone(report: Report) -> None:
    """In a live process: the groups torch knows that this package did not make reloadable,
    which every cycle, WORLD's swap included, leaves as they are (and a problem where this torch
    would reach one through the swap anyway)."""
    if not report.torch.get("patched") or "torch.distributed" not in sys.modules:
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    from ..groups.store import channel
    from ..groups.world import carry

    groups = carry.left_alone()
    report.left_alone = [{"name": carry.name(g), **carry.describe(g)} for g in groups]
    registered = channel.registration()
    if registered is not None and registered.swap:
        report.problems.extend(
            f"the next destroy_process_groups() will refuse: {line}"
            for line in carry.obstacles(groups)
        )


def _render_left_alone(report: Report) -> list[str]:
    lines = []
    for entry in report.left_alone:
        ranks = f"ranks {entry['ranks']}, " if entry["ranks"] is not None else ""
        memory = f"; its backend holds {entry['memory']}" if entry["memory"] else ""
        lines.append(
            f"  left alone   {entry['name']!r} ({ranks}{entry['backend']}): {entry['why']}; no "
            f"cycle frees, suspends or shuts it down{memory}"
        )
    return lines


def _lifecycle_callers(frameworks: set[str]) -> dict[str, dict[str, str]]:
    """Modules that hold a lifecycle name, and whose function each one is (ours or a
    framework's): the names an actor bound at import decide where its calls go."""
    from ..adoption import adopted
    from ..groups import lifecycle
    from ..groups.world import registration as world

    ours = {
        id(f): f
        for f in (
            lifecycle.destroy_process_groups,
            lifecycle.reload_process_groups,
            world.register_default_process_group,
            adopted.monkey_patch_torch_dist,
        )
    }
    out: dict[str, dict[str, str]] = {}
    for module_name, module in list(sys.modules.items()):
        if module_name.split(".", 1)[0] in ("reloadpg_autopatch", "torch"):
            continue
        namespace = getattr(module, "__dict__", None)
        if type(namespace) is not dict:
            continue
        for name in _env.ADOPTED_NAMES:
            value = namespace.get(name)
            if value is None or not callable(value):
                continue
            home = getattr(value, "__module__", None)
            try:
                inner = inspect.unwrap(value)
            except ValueError:
                inner = value
            if ours.get(id(value)) is value or ours.get(id(inner)) is inner:
                out.setdefault(module_name, {})[name] = "reloadpg_autopatch"
            elif home in frameworks:
                out.setdefault(module_name, {})[name] = str(home)
    return out


def _render_adoption(report: Report) -> list[str]:
    """The doctor's lines on adoption (see ``_check_adoption``)."""
    info = report.adoption
    if not info:
        return []
    state = "on" if info["on"] else "not understood, so off" if info["problem"] else "off"
    lines = [
        f"  adoption     {_env.ADOPT_ENV}={excerpt(info['variable'])} -> {state}; watching "
        + ", ".join(info["modules"])
    ]
    if not info["seen"]:
        lines.append("                 no framework lifecycle module is imported in this process")
    for entry in info["seen"]:
        if entry["kept"] is None:
            jobs = entry.get("kept_jobs")
            kept = f"; kept of its patch: {'; '.join(jobs)}" if jobs else ""
            lines.append(
                f"                 {entry['module']}: adopted ({', '.join(entry['adopted'])} "
                f"call reloadpg_autopatch's lifecycle){kept}"
            )
        else:
            guarded = "; its destroyed groups are refused" if entry.get("guarded") else ""
            lines.append(
                f"                 {entry['module']}: its own lifecycle ({entry['kept']}){guarded}"
            )
    for module_name, names in sorted(info["callers"].items()):
        by_owner: dict[str, list[str]] = {}
        for name, owner in names.items():
            by_owner.setdefault(owner, []).append(name)
        reached = "; ".join(f"{', '.join(n)} -> {owner}" for owner, n in by_owner.items())
        lines.append(f"  lifecycle    {module_name}: {reached}")
    return lines


def _torch_absent(report: Report) -> None:
    """No torch here: nothing to patch, which is healthy unless the gate asks for the patch."""
    report.torch["installed"] = False
    report.activation = _startup.status()
    gate = report.gate
    if gate.get("verdict") == "on":
        report.problems.append(
            f"the gate is on ({gate['variable']}={excerpt(gate['value'])}) but torch is not "
            f"importable in this interpreter ({sys.executable}): install torch into this "
            "environment, or run the doctor with the training process's interpreter"
        )


def diagnose(imports: list[str] | None = None) -> Report:
    """Run every check in this interpreter."""
    report = Report(
        python=sys.version.split()[0],
        executable=sys.executable,
        site_processing=not sys.flags.no_site,
    )
    _check_install(report)
    _check_gate(report)
    _check_torch(report, list(imports or []))
    _check_adoption(report)
    _check_left_alone(report)
    return report


def render(report: Report) -> str:
    """The human-readable report."""
    lines = [f"reloadpg_autopatch {report.version} doctor"]
    lines.append(f"  python       {report.python} ({report.executable})")
    lines.append(
        f"  site         processing {'on' if report.site_processing else 'OFF (-S)'}; "
        f"site-packages: {', '.join(report.site_dirs) or '-'}"
    )
    for copy in report.copies:
        lines.append(f"  copy         {_describe_copy(copy)}")
    for label, info, name in (
        (".pth", report.pth, pth.PTH_NAME),
        (".start", report.start, pth.START_NAME),
    ):
        if info.get("installed"):
            state = "current" if info["current"] else "DIFFERENT from this version"
            lines.append(f"  {label:<12} installed: {info['path']} ({state})")
        else:
            lines.append(f"  {label:<12} not installed ({name})")
    gate = report.gate
    lines.append(f"  gate         {gate['variable']}={excerpt(gate['value'])} -> {gate['verdict']}")
    for name, value in report.options.items():
        if value is not None:
            lines.append(f"  option       {name}={excerpt(value)}")
    torch_info = report.torch
    if torch_info.get("version"):
        count = len(torch_info.get("patched_functions", []))
        patched = f"yes ({count} functions)" if torch_info["patched"] else "no"
        lines.append(
            f"  torch        {torch_info['version']}; torch.distributed patched: {patched}"
        )
        if torch_info.get("outer_patch_on_new_group"):
            lines.append("  layering     another patch wraps new_group on top of ours (it wraps)")
    elif torch_info.get("installed") is False:
        lines.append("  torch        not installed in this interpreter: nothing to patch")
    for name, outcome in report.imports.items():
        lines.append(f"  import       {name}: {outcome}")
    if torch_info.get("patched"):
        if report.stale:
            lines.append(f"  stale refs   {len(report.stale)}:")
            lines.extend(f"                 {s['module']}.{s['attribute']}" for s in report.stale)
        else:
            lines.append(f"  stale refs   none in {len(sys.modules)} loaded modules")
    fid = report.fidelity
    if fid.get("c10d"):
        c = fid["c10d"]
        only = ", ".join(c["namespace_only"]) or "none"
        lines.append(
            f"  c10d         {c['installed']} wrappers also in distributed_c10d "
            f"(namespace only: {only})"
        )
    if fid.get("compile"):
        c = fid["compile"]
        if c.get("loaded"):
            lines.append(
                f"  compile      torch.compile remaps {len(c['registered'])} of our collectives"
                + (f"; MISSING: {', '.join(c['missing'])}" if c["missing"] else "")
            )
        else:
            lines.append(
                "  compile      remaps registered when torch.compile first needs them"
                if c.get("waiting")
                else "  compile      remaps NOT registered"
            )
    if fid.get("groups"):
        g = fid["groups"]
        state = "consistent" if not g["inconsistent"] else "INCONSISTENT"
        lines.append(
            f"  groups       {g['reloadable']} reloadable, {g['aliases']} aliases in torch's "
            f"maps, names {state}"
        )
    if report.cycle:
        from ..groups.report import describe

        guard = report.cycle["guard"]
        if guard["min_free_gb"] > 0:
            when = (
                "every collective" if guard["every_call"] else "a reloaded group's first collective"
            )
            lines.append(
                f"  guard        {guard['min_free_gb']:g} GiB free wanted before {when} "
                f"({guard['probe']} memory query)"
            )
        else:
            lines.append(f"  guard        off ({_env.MIN_FREE_ENV}=0)")
        names = report.cycle["hooks"]
        lines.append(
            f"  hooks        {len(names)} reload hooks" + (f": {', '.join(names)}" if names else "")
        )
        lines.append(f"  releases     before each destroy: {report.cycle['releases']}")
        last = report.cycle["last"]
        lines.append(
            f"  last cycle   {describe(last)}" if last else "  last cycle   none in this process"
        )
    if fid.get("mode"):
        m = fid["mode"]
        lines.append(f"  mode         {m['mode']} ({_env.MODE_ENV}={excerpt(m['variable'])})")
        for backend, how in m["backends"].items():
            lines.append(f"                 {backend}: {how}")
    if fid.get("nccl"):
        n = fid["nccl"]
        shown = "unset" if n["value"] is None else excerpt(n["value"])
        absent = "" if n["nccl_available"] else "; this torch build has no NCCL"
        lines.append(
            f"  nccl         'nccl' resolves to {n['resolves_to']} ({n['variable']}={shown}; "
            f"this torch's default: {n['default']}; {n['how']}{absent})"
        )
        for leg in n["world"]:
            lines.append(
                f"                 WORLD on {leg['device']}: {leg['class']} "
                f"(name() {leg['name']!r}: {leg['implementation']})"
            )
    if fid.get("suspend"):
        sus = fid["suspend"]
        nccl = (
            f"NCCL build {sus['nccl_build']}, runtime {sus['nccl_runtime']}"
            if sus["nccl_build"]
            else "no NCCL in this torch"
        )
        lines.append(
            f"  suspend      torch {sus['torch']}: "
            + ("Backend.suspend present" if sus["available"] else "no Backend.suspend")
            + f", guard by {sus['guard']}; {nccl}; {sus['resident_always']}"
        )
        if sus.get("auto"):
            lines.append(f"                 auto: {sus['auto']}")
        for warning in sus["warnings"]:
            lines.append(f"                 warning: {warning}")
    if report.forwarding:
        fwd = report.forwarding
        lines.append(
            f"  forwarding   ReloadableProcessGroup forwards {len(fwd['methods'])} methods and "
            f"{len(fwd['properties'])} properties of this torch's ProcessGroup"
        )
        for label in ("methods", "properties", "inherited"):
            text = f"{label}: {', '.join(fwd[label])}"
            lines.append(
                textwrap.fill(text, 96, initial_indent=" " * 17, subsequent_indent=" " * 19)
            )
    lines.extend(_render_adoption(report))
    lines.extend(_render_left_alone(report))
    for note in report.notes:
        lines.append(f"  note         {note}")
    for problem in report.problems:
        lines.append(f"  PROBLEM      {problem}")
    lines.append(f"verdict: {report.verdict}")
    return "\n".join(lines)
