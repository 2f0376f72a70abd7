"""The model's switches: what one backend does, read when it is created.

Each backend reads them at creation: first ``configure(...)`` (module level, in the rank), then
the environment, then its variant's defaults (``register_variant``), then the defaults below.
A test may also change ``backend.settings`` on a live backend. Environment values take
``VALUE`` (every rank) or ``VALUE@RANKS`` (``RANKS``: comma-separated global ranks, or ``*``):

==================================  ===============================================================
``SUSPENDABLE_BYTES``               suspendable bytes per backend (default 1 MiB)
``SUSPENDABLE_PERSIST_BYTES``       resident bytes per backend (default 256 KiB)
``SUSPENDABLE_FLAVOR``              ``classic`` (ProcessGroupNCCL) or ``nccl2``: the wording of
                                    the uninitialized error
``SUSPENDABLE_UNINITIALIZED``       ``1``: no communicator yet; ``memory_stats`` / ``suspend`` /
                                    ``resume`` raise ``RuntimeError("NCCL communicator not
                                    initialized.")`` until ``backend.initialize()`` or (variant B)
                                    its first collective, as classic NCCL's lazy init does
``SUSPENDABLE_UNSUPPORTED``         ``backend`` ("Backend <name> does not support suspend"),
                                    ``old_nccl`` ("getMemoryStats() requires NCCL 2.29.7 or
                                    later"), or ``split_share`` (stats work; suspend / resume
                                    raise ``ncclInvalidUsage`` before the barrier)
``SUSPENDABLE_HANG``                ``suspend``, ``resume`` or ``both``: that call never arrives
                                    (blocks, without holding the comm's lock, until
                                    ``backend.arrive()`` lets it go on late or ``backend.abort()``
                                    makes it raise)
``SUSPENDABLE_FAIL_AFTER_BARRIER``  ``suspend``, ``resume`` or ``both``: raise after the barrier.
                                    Suspend then leaves the comm half-suspended: memory freed,
                                    ``suspended`` still 0, the content lost; resume refuses ("Not
                                    in suspended state") and suspend refuses too. Resume leaves it
                                    suspended, so that a retry may succeed
``SUSPENDABLE_OOM_ON_RESUME``       ``1``: resume raises out-of-memory before the barrier even
                                    when the pretend device has room (it always does when not)
``SUSPENDABLE_BARRIER_TIMEOUT``     seconds before a suspend / resume barrier gives up; default
                                    none, as in NCCL
``SUSPENDABLE_DEVICE_TOTAL``        the pretend device's size in bytes (default 1 GiB; read at
                                    each query; ``set_device_total()`` wins; every rank)
``SUSPENDABLE_DEVICE_OCCUPIED``     bytes another tenant holds on it (default 0; read at each
                                    query; ``occupy()`` wins; every rank)
``SUSPENDABLE_ACCELERATOR``         the pretend accelerator's device type (default
                                    ``privateuseone``; read at import)
==================================  ===============================================================

The last three are the pretend device's (``device``) and the accelerator tensor's
(``accelerator``); the others are a backend's, below.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

KiB = 2**10
MiB = 2**20
GiB = 2**30

_overrides: dict[str, Any] = {}


@dataclasses.dataclass
class Settings:
    """What one backend does; read at creation (``configure`` > environment > defaults)."""

    suspend_bytes: int = 1 * MiB
    persist_bytes: int = 256 * KiB
    flavor: str = "classic"  # or "nccl2": the uninitialized message
    uninitialized: bool = False
    unsupported: str | None = None  # "backend", "old_nccl" or "split_share"
    hang: str | None = None  # "suspend", "resume" or "both"
    fail_after_barrier: str | None = None  # "suspend", "resume" or "both"
    oom_on_resume: bool = False
    barrier_timeout: float | None = None  # seconds; None: never, as in NCCL

    def applies(self, switch: str | None, call: str) -> bool:
        return switch in (call, "both")


_ENV = {
    "suspend_bytes": ("SUSPENDABLE_BYTES", int),
    "persist_bytes": ("SUSPENDABLE_PERSIST_BYTES", int),
    "flavor": ("SUSPENDABLE_FLAVOR", str),
    "uninitialized": ("SUSPENDABLE_UNINITIALIZED", "flag"),
    "unsupported": ("SUSPENDABLE_UNSUPPORTED", str),
    "hang": ("SUSPENDABLE_HANG", str),
    "fail_after_barrier": ("SUSPENDABLE_FAIL_AFTER_BARRIER", str),
    "oom_on_resume": ("SUSPENDABLE_OOM_ON_RESUME", "flag"),
    "barrier_timeout": ("SUSPENDABLE_BARRIER_TIMEOUT", float),
}
_CHOICES = {
    "flavor": {"classic", "nccl2"},
    "unsupported": {None, "backend", "old_nccl", "split_share"},
    "hang": {None, "suspend", "resume", "both"},
    "fail_after_barrier": {None, "suspend", "resume", "both"},
}


def _env_value(name: str, global_rank: int) -> str | None:
    """``VALUE`` or ``VALUE@RANKS`` from the environment, for this rank; None when unset."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    value, _, ranks = raw.partition("@")
    chosen = {int(r) for r in ranks.split(",") if r.strip()} if ranks not in ("", "*") else None
    if chosen is not None and global_rank not in chosen:
        return None
    return value


def _parse(kind: Any, text: str) -> Any:
    if kind == "flag":
        return text.lower() not in ("0", "false", "no", "off", "")
    return kind(text)


def _check(settings: Settings) -> Settings:
    for field, allowed in _CHOICES.items():
        if getattr(settings, field) not in allowed:
            raise ValueError(f"suspendable: {field}={getattr(settings, field)!r}, not in {allowed}")
    return settings


def settings_for(global_rank: int, defaults: dict[str, Any] | None = None) -> Settings:
    """The settings a backend created now in this rank gets (``defaults``: its variant's)."""
    values: dict[str, Any] = dict(defaults or {})
    for field, (env, kind) in _ENV.items():
        text = _env_value(env, global_rank)
        if text is not None:
            values[field] = _parse(kind, text)
    values.update(_overrides)
    return _check(Settings(**values))


def check_names(changes: dict[str, Any], caller: str) -> None:
    """Refuse switch names ``Settings`` does not have, naming them."""
    unknown = set(changes) - {f.name for f in dataclasses.fields(Settings)}
    if unknown:
        raise TypeError(f"suspendable.{caller}(): unknown switches {sorted(unknown)}")


def configure(**changes: Any) -> None:
    """Override switches (``Settings`` field names) for backends this rank creates from now on.

    They win over the environment; ``configure()`` with nothing, or ``reset()``, clears them.
    """
    check_names(changes, "configure")
    if not changes:
        _overrides.clear()
        return
    _check(Settings(**{**_overrides, **changes}))
    _overrides.update(changes)


def clear() -> None:
    """Forget ``configure()``'s overrides."""
    _overrides.clear()
