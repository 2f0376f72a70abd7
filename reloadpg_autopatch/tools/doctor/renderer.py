"""The one renderer of the doctor's report: human text, a line or a few per fact, in the order
the rooms were asked; or the report as JSON.

It reads the report alone, never the interpreter: whatever a line says was gathered by
``diagnose()``.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable

from ... import _env
from ..._env import excerpt
from ..._startup import pth
from ..._startup.facts import describe_copy
from .report import Report


def as_json(report: Report) -> str:
    """The report as JSON (``--json``): its fields, and the verdict."""
    return json.dumps(report.to_dict(), indent=2)


def interpreter(report: Report) -> list[str]:
    """Python, site processing, the copies of the package, the site files, the gate, options."""
    lines = [f"  python       {report.python} ({report.executable})"]
    lines.append(
        f"  site         processing {'on' if report.site_processing else 'OFF (-S)'}; "
        f"site-packages: {', '.join(report.site_dirs) or '-'}"
    )
    lines += [f"  copy         {describe_copy(copy)}" for copy in report.copies]
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
    lines += [
        f"  option       {name}={excerpt(value)}"
        for name, value in report.options.items()
        if value is not None
    ]
    return lines


def patch(report: Report) -> list[str]:
    """torch, whether it is patched, the modules imported first, the stale references."""
    lines = []
    torch = report.torch
    if torch.get("version"):
        count = len(torch.get("patched_functions", []))
        patched = f"yes ({count} functions)" if torch["patched"] else "no"
        lines.append(f"  torch        {torch['version']}; torch.distributed patched: {patched}")
        if torch.get("outer_patch_on_new_group"):
            lines.append("  layering     another patch wraps new_group on top of ours (it wraps)")
    elif torch.get("installed") is False:
        lines.append("  torch        not installed in this interpreter: nothing to patch")
    lines += [f"  import       {name}: {outcome}" for name, outcome in report.imports.items()]
    if torch.get("patched"):
        if report.stale:
            lines.append(f"  stale refs   {len(report.stale)}:")
            lines += [f"                 {s['module']}.{s['attribute']}" for s in report.stale]
        else:
            lines.append(f"  stale refs   none in {report.loaded_modules} loaded modules")
    return lines


def fidelity(report: Report) -> list[str]:
    """Our wrappers in distributed_c10d and in torch.compile's table; the groups' names."""
    lines = []
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
    return lines


def cycle(report: Report) -> list[str]:
    """The memory guard, the reload hooks, the releases and the last cycle."""
    if not report.cycle:
        return []
    lines = []
    guard = report.cycle["guard"]
    if guard["min_free_gb"] > 0:
        when = "every collective" if guard["every_call"] else "a reloaded group's first collective"
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
    if not last:
        return [*lines, "  last cycle   none in this process"]
    from ...groups.report import describe  # its one line, as the log and the demo say it

    return [*lines, f"  last cycle   {describe(last)}"]


def ways(report: Report) -> list[str]:
    """The mode and what it does per backend; what nccl means; what a suspend can free."""
    lines = []
    fid = report.fidelity
    if fid.get("mode"):
        m = fid["mode"]
        lines.append(f"  mode         {m['mode']} ({_env.MODE_ENV}={excerpt(m['variable'])})")
        lines += [f"                 {backend}: {how}" for backend, how in m["backends"].items()]
    if fid.get("nccl"):
        n = fid["nccl"]
        shown = "unset" if n["value"] is None else excerpt(n["value"])
        absent = "" if n["nccl_available"] else "; this torch build has no NCCL"
        lines.append(
            f"  nccl         'nccl' resolves to {n['resolves_to']} ({n['variable']}={shown}; "
            f"this torch's default: {n['default']}; {n['how']}{absent})"
        )
        lines += [
            f"                 WORLD on {leg['device']}: {leg['class']} "
            f"(name() {leg['name']!r}: {leg['implementation']})"
            for leg in n["world"]
        ]
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
        lines += [f"                 warning: {warning}" for warning in sus["warnings"]]
    return lines


def forwarding(report: Report) -> list[str]:
    """Which ProcessGroup members the wrapper forwards."""
    fwd = report.forwarding
    if not fwd:
        return []
    lines = [
        f"  forwarding   ReloadableProcessGroup forwards {len(fwd['methods'])} methods and "
        f"{len(fwd['properties'])} properties of this torch's ProcessGroup"
    ]
    for label in ("methods", "properties", "inherited"):
        text = f"{label}: {', '.join(fwd[label])}"
        lines.append(textwrap.fill(text, 96, initial_indent=" " * 17, subsequent_indent=" " * 19))
    return lines


def adoption(report: Report) -> list[str]:
    """The switch, each framework's lifecycle module, and who holds the lifecycle names."""
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


def left_alone(report: Report) -> list[str]:
    """The groups every cycle leaves alone (a live process)."""
    lines = []
    for entry in report.left_alone:
        ranks = f"ranks {entry['ranks']}, " if entry["ranks"] is not None else ""
        memory = f"; its backend holds {entry['memory']}" if entry["memory"] else ""
        lines.append(
            f"  left alone   {entry['name']!r} ({ranks}{entry['backend']}): {entry['why']}; no "
            f"cycle frees, suspends or shuts it down{memory}"
        )
    return lines


def verdict(report: Report) -> list[str]:
    """The notes, the problems, and the verdict."""
    lines = [f"  note         {note}" for note in report.notes]
    lines += [f"  PROBLEM      {problem}" for problem in report.problems]
    return [*lines, f"verdict: {report.verdict}"]


#: The report's sections, in the order they print.
SECTIONS: tuple[Callable[[Report], list[str]], ...] = (
    interpreter,
    patch,
    fidelity,
    cycle,
    ways,
    forwarding,
    adoption,
    left_alone,
    verdict,
)


def render(report: Report) -> str:
    """The human-readable report."""
    lines = [f"reloadpg_autopatch {report.version} doctor"]
    for section in SECTIONS:
        lines += section(report)
    return "\n".join(lines)
