"""``diagnose()``: ask each room of the package for its facts, in the order the report shows
them, and collect the problems each one sees.

Each room reports on itself (``_startup.facts``, ``patching.facts``, ``adoption.facts``,
``groups.facts``, ``groups.world.facts``, ``groups.ways.suspend.facts``, and the NCCL
implementations here in ``implementations``); this module only puts their answers in the
report and judges what crosses rooms (the gate on, but no torch or no patch). A room that needs
torch is imported only once torch imported, so the doctor answers without torch too.
"""

from __future__ import annotations

import importlib
import sys

from ..._env import excerpt
from ..._startup import facts as startup
from .report import Report


def interpreter(report: Report) -> None:
    """The site directories, the copies of the package, its site files, the gate and the
    variables beside it, and why the gate could not have activated the patch."""
    install, notes, problems = startup.install(report.site_processing)
    report.site_dirs = install["site_dirs"]
    report.copies = install["copies"]
    report.pth, report.start = install["pth"], install["start"]
    report.notes += notes
    report.problems += problems
    report.gate, problems = startup.gate()
    report.problems += problems
    report.options, problems = startup.options()
    report.problems += problems
    if report.gate["verdict"] == "on":
        report.problems += startup.activation_problems(install, report.site_processing)


def first_imports(report: Report, names: list[str]) -> None:
    """Import ``names`` first, as the training process would; a failure is a problem."""
    for name in names:
        try:
            importlib.import_module(name)
            report.imports[name] = "ok"
        except Exception as error:  # any import error is the user's to see, not ours to raise
            report.imports[name] = f"{type(error).__name__}: {error}"
            report.problems.append(f"--import {name} failed: {type(error).__name__}: {error}")


def torch_found(report: Report) -> bool:
    """Whether torch.distributed imports here; without it, whether the gate asks for it."""
    try:
        import torch.distributed  # noqa: F401
    except Exception as error:
        report.torch = {"version": None, "patched": False}
        if isinstance(error, ModuleNotFoundError) and error.name == "torch":
            report.torch["installed"] = False
            report.activation = startup.activation()
            gate = report.gate
            if gate.get("verdict") == "on":
                report.problems.append(
                    f"the gate is on ({gate['variable']}={excerpt(gate['value'])}) but torch is "
                    f"not importable in this interpreter ({sys.executable}): install torch into "
                    "this environment, or run the doctor with the training process's interpreter"
                )
        else:
            report.problems.append(
                f"cannot import torch.distributed: {type(error).__name__}: {error}"
            )
        return False
    return True


def patch(report: Report) -> None:
    """What is patched, and every reference still holding one of torch's originals."""
    from ...patching import facts

    report.activation = startup.activation()
    report.torch = facts.patch()
    patched = report.torch["patched"]
    if report.gate.get("verdict") == "on" and not patched and report.site_processing:
        report.problems.append(
            "the gate is on but torch.distributed is not patched: the .pth line did not run "
            "or the patch failed (see the line it printed on stderr)"
        )
    if patched:
        report.stale, problems = facts.stale()
        report.problems += problems


def forwarding(report: Report) -> None:
    """Which ``ProcessGroup`` members the wrapper forwards."""
    from ...groups import facts as lifecycle

    report.forwarding = lifecycle.forwarding()


def ways(report: Report) -> None:
    """The reload mode and what it does with each backend in use; what ``nccl`` means here and
    what serves WORLD; in the suspend and auto modes, what a suspend can and cannot free."""
    from ...groups import facts as lifecycle
    from ...groups.ways.suspend import facts as suspend
    from ...groups.world import facts as world
    from .implementations import facts as nccl
    from .implementations import suspend_warnings

    report.fidelity["mode"], problems = lifecycle.modes()
    report.problems += problems
    report.fidelity["nccl"], found = nccl(world.native(), world.backend_names())
    chosen = report.fidelity["mode"]["mode"]
    if chosen in ("suspend", "auto"):
        warnings = suspend_warnings(
            found, world.bound_device() is not None, report.fidelity["mode"]["backends"]
        )
        report.fidelity["suspend"] = suspend.facts(warnings, auto=chosen == "auto")


def fidelity(report: Report) -> None:
    """Each mechanism that keeps torch from telling our groups apart from its own."""
    import torch.distributed as dist

    from ...groups import facts as lifecycle
    from ...patching import facts as patching

    for key, (found, problems) in (
        ("c10d", patching.c10d_wrappers()),
        ("compile", patching.compile_remaps(startup.waiting_for)),
        ("groups", lifecycle.names()),
    ):
        report.fidelity[key] = found
        report.problems += problems
    report.fidelity["initialized"] = dist.is_initialized()


def cycle(report: Report) -> None:
    """The memory guard, the reload hooks, the releases and the last cycle of this process."""
    from ...groups import facts as lifecycle

    report.cycle = lifecycle.cycle()


def adoption(report: Report) -> None:
    """Which lifecycle the frameworks' calls reach (``adoption.facts``)."""
    from ...adoption import facts as adopt_facts

    options, problems = startup.adoption_options()
    report.options.update(options)
    report.problems += problems
    report.adoption, problems = adopt_facts.facts(bool(report.torch.get("patched")))
    report.problems += problems


def left_alone(report: Report) -> None:
    """In a live process: the groups no cycle frees or brings back."""
    if not report.torch.get("patched") or "torch.distributed" not in sys.modules:
        return
    from ...groups.world import facts as world

    report.left_alone, problems = world.left_alone()
    report.problems += problems


def diagnose(imports: list[str] | None = None) -> Report:
    """Every check of this interpreter, each room's facts in the report's order."""
    report = Report(
        python=sys.version.split()[0],
        executable=sys.executable,
        site_processing=not sys.flags.no_site,
    )
    interpreter(report)
    first_imports(report, list(imports or []))
    if torch_found(report):
        import torch.distributed as dist

        patch(report)
        if dist.is_available():
            forwarding(report)
            ways(report)
        if report.torch["patched"]:
            fidelity(report)
            cycle(report)
    adoption(report)
    left_alone(report)
    report.loaded_modules = len(sys.modules)
    return report
