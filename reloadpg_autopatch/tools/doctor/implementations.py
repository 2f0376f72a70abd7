"""Which implementation a backend is, and which one the name ``nccl`` resolves to.

torch 2.14 registers three NCCL implementations besides the classic ``ProcessGroupNCCL``:
``nccl2`` (``ProcessGroupNCCL2``), ``nccl-lazy`` (``ProcessGroupNCCLLazy``) and ``nccl-legacy``
(the classic one, by name). Which one a plain ``"nccl"`` group gets is read from
``TORCH_DIST_USE_NCCL2`` when torch registers ``nccl`` (lazily, at its first use; frozen for
the process after that): on torch 2.14 only ``"1"`` selects nccl2; from torch 2.15 on nccl2 is
the default and only ``"0"`` selects the classic one (pytorch PR #192281). The behaviour the
package meets differs by implementation (nccl2 splits every group from WORLD's at creation,
the classic one makes lazy p2p communicators), so the doctor and ``scripts/gpu_smoke.py`` say
which one ran, and the doctor keys its suspend warnings on it. Nothing chooses a way from this:
the ways ask the backend what it can do.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

#: The variable that chooses what ``nccl`` means.
VARIABLE = "TORCH_DIST_USE_NCCL2"
CLASSIC, NCCL2, LAZY = "classic", "nccl2", "nccl-lazy"
#: What each implementation's ``name()`` answers (torch's ``NCCL_BACKEND_NAME`` and the
#: ``kBackendName`` constants of its nccl2 headers), and its class, for the doctor's words.
BY_NAME = {"nccl": CLASSIC, "nccl2": NCCL2, "nccl-lazy": LAZY}
CLASSES = {
    CLASSIC: "ProcessGroupNCCL",
    NCCL2: "ProcessGroupNCCL2",
    LAZY: "ProcessGroupNCCLLazy",
}
_BY_CLASS = {cls: impl for impl, cls in CLASSES.items()}


def _peeled(backend: Any) -> Any:
    """The backend inside ``TORCH_DISTRIBUTED_DEBUG=DETAIL``'s wrapper, which checks calls."""
    for _ in range(4):
        inner = getattr(backend, "wrapped_pg", None)
        if inner is None:
            return backend
        backend = inner
    return backend


def implementation(backend: Any) -> str:
    """``"classic"``, ``"nccl2"``, ``"nccl-lazy"``, or what any other backend calls itself."""
    backend = _peeled(backend)
    try:
        name = str(backend.name())
    except Exception:  # a backend that does not say: its class does
        name = ""
    if name in BY_NAME:
        return BY_NAME[name]
    cls = type(backend).__name__
    return _BY_CLASS.get(cls, name or cls)


def describe(backend: Any) -> dict[str, str]:
    """A backend as the doctor shows it: its implementation, class and ``name()``."""
    inner = _peeled(backend)
    try:
        name = str(inner.name())
    except Exception:
        name = "?"
    return {"implementation": implementation(inner), "class": type(inner).__name__, "name": name}


def of_group(group: Any) -> list[dict[str, str]]:
    """What serves each device of a native group (``device`` added), in torch's order."""
    out = []
    for device in getattr(group, "_device_types", ()) or ():
        try:
            backend = group._get_backend(device)
        except Exception:  # no backend for that device (yet, or any more)
            backend = None
        if backend is not None:
            out.append({"device": str(getattr(device, "type", device)), **describe(backend)})
    return out


def _version(text: str) -> tuple[int, int]:
    parts = []
    for piece in text.split("+", 1)[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    while len(parts) < 2:
        parts.append(0)
    return parts[0], parts[1]


def default(torch_version: str, has_nccl2: bool = True) -> str:
    """What ``nccl`` means on a torch with the variable unset."""
    return NCCL2 if has_nccl2 and _version(torch_version) >= (2, 15) else CLASSIC


def predicted(torch_version: str, value: str | None, has_nccl2: bool = True) -> str:
    """What ``nccl`` means on ``torch_version`` with the variable at ``value`` (None: unset):
    2.14 takes nccl2 for exactly ``"1"``, 2.15 the classic one for exactly ``"0"``."""
    if not has_nccl2:
        return CLASSIC
    if _version(torch_version) >= (2, 15):
        return CLASSIC if value == "0" else NCCL2
    return NCCL2 if value == "1" else CLASSIC


def resolution(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What ``nccl`` resolves to in this process: registered already (what torch chose,
    frozen), else what torch would choose now; with the variable, its value and the default."""
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    environ = os.environ if environ is None else environ
    value = environ.get(VARIABLE)
    nccl2_creator = getattr(c10d, "_create_nccl2_process_group", None)
    has_nccl2 = nccl2_creator is not None
    out: dict[str, Any] = {
        "variable": VARIABLE,
        "value": value,
        "default": default(torch.__version__, has_nccl2),
        "nccl_available": bool(dist.is_nccl_available()),
    }
    plugin = (getattr(dist.Backend, "_plugins", None) or {}).get("NCCL")
    creator = getattr(plugin, "creator_fn", None) if plugin is not None else None
    if creator is None and isinstance(plugin, tuple) and plugin:
        creator = plugin[0]
    if creator is not None:
        out["resolves_to"] = NCCL2 if creator is nccl2_creator else CLASSIC
        out["how"] = f"registered by torch ({getattr(creator, '__name__', creator)})"
    else:
        out["resolves_to"] = predicted(torch.__version__, value, has_nccl2)
        out["how"] = f"not registered yet: what torch {torch.__version__} would choose"
    return out


def in_use(legs: list[dict[str, str]], names: Iterable[str], resolves_to: str) -> set[str]:
    """The NCCL implementations WORLD runs: its backends as they answer (``legs``); where they
    do not answer, what WORLD's backend ``names`` say (``nccl`` means ``resolves_to``)."""
    found = {leg["implementation"] for leg in legs} & set(CLASSES)
    if not legs:
        names = tuple(names)
        if "nccl" in names:
            found.add(resolves_to)
        found |= {BY_NAME[n] for n in names if n in ("nccl2", "nccl-lazy")}
    return found


def facts(world: Any, names: Iterable[str]) -> tuple[dict[str, Any], set[str]]:
    """What ``nccl`` resolves to here and what serves WORLD (its native group, or None before
    ``init_process_group``); and the NCCL implementations in use (``in_use``)."""
    info = resolution()
    legs = of_group(world) if world is not None else []
    info["world"] = legs
    return info, in_use(legs, names, info["resolves_to"])


def suspend_warnings(
    found: set[str],
    bound: bool,
    backends: Iterable[str],
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """What keeps a suspend from freeing what it could, by the implementations in use
    (``found``), whether WORLD is bound to a device, and the backends the mode met."""
    environ = os.environ if environ is None else environ
    warnings = []
    if CLASSIC in found and not bound:
        warnings.append(
            "WORLD has no device_id: the classic ProcessGroupNCCL creates p2p "
            "communicators lazily, which suspend neither frees nor counts; pass device_id "
            "to init_process_group"
        )
    if found and environ.get("NCCL_NVLS_ENABLE", "").strip() != "0":
        warnings.append(
            "NVLS buffers stay resident while asleep (NCCL_NVLS_ENABLE=0 frees more on "
            "NVSwitch nodes)"
        )
    if NCCL2 in found:
        warnings.append(
            "nccl2 makes each new group's communicator by splitting WORLD's at creation: "
            "no group is created while WORLD sleeps (new_group, split_group and "
            "shrink_group raise GroupSuspendedError until reload_process_groups())"
        )
    if LAZY in found or "nccl-lazy" in set(backends):
        warnings.append(
            "nccl-lazy suspends its pair communicators in map order, which may not match "
            "across ranks"
        )
    return warnings
