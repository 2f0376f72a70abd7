"""Patch ``torch.distributed`` so every group-taking function accepts reloadable groups.

The set of functions is derived from the installed torch: every callable of the
``torch.distributed`` namespace with a process-group parameter (see ``_wrapgen.group_params``).
torch 2.13 has 44 of them, among them the renamed ``all_gather_single`` and
``reduce_scatter_single`` that slime's hand-kept list of 27 lacks; a future torch's additions are
covered the day it is installed.
"""

from __future__ import annotations

import logging
import os
import threading
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("reloadpg_autopatch")

#: Test switch: makes the patch raise, to prove that a failure never breaks the host.
FAIL_ENV = "SLIME_RELOADABLE_PG_INJECT_FAILURE"

_LOCK = threading.RLock()


@dataclass
class PatchState:
    """What the patch replaced, kept so the sweep and the doctor can match identities."""

    originals: dict[str, Any]
    wrappers: dict[str, Any]
    #: id(original) -> (original, wrapper), built once: the sweep looks values up by id.
    by_original_id: dict[int, tuple[Any, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.by_original_id = {
            id(original): (original, self.wrappers[name])
            for name, original in self.originals.items()
        }


_STATE: PatchState | None = None


def state() -> PatchState | None:
    """The patch of this process, or None when ``torch.distributed`` is untouched."""
    return _STATE


def is_patched() -> bool:
    """Whether ``monkey_patch_torch_dist()`` has run in this process."""
    return _STATE is not None


def original(name: str) -> Any:
    """torch's own ``torch.distributed.<name>``, patched or not."""
    if _STATE is not None and name in _STATE.originals:
        return _STATE.originals[name]
    import torch.distributed as dist

    return getattr(dist, name)


def destroy_native(group: Any) -> None:
    """Destroy a native group, tolerating one torch already tore down."""
    try:
        original("destroy_process_group")(group)
    except ValueError as error:  # "Invalid process group specified": already gone
        logger.debug("group %r was already destroyed: %s", group, error)


def _inject_failure_if_asked() -> None:
    if os.environ.get(FAIL_ENV, "").strip().lower() == "patch":
        raise RuntimeError(f"failure injected by {FAIL_ENV}=patch")


def _build(dist: types.ModuleType) -> PatchState:
    from . import factories
    from ._unwrap import unwrap
    from ._wrapgen import generate, group_params, is_generated, signature_of
    from .group import ReloadableProcessGroup

    native = dist.ProcessGroup
    snapshot = {name: obj for name, obj in vars(dist).items() if callable(obj)}
    originals: dict[str, Any] = {}
    wrappers: dict[str, Any] = {}

    def use(name: str, wrapper: Any) -> None:
        originals[name] = snapshot[name]
        wrappers[name] = wrapper

    new_group = factories.make_new_group(snapshot["new_group"], dist)
    use("new_group", new_group)
    use(
        "destroy_process_group",
        factories.make_destroy_process_group(snapshot["destroy_process_group"], destroy_native),
    )
    helpers = factories.make_helpers(snapshot, factories.discover_helpers(snapshot), dist)

    for name, obj in snapshot.items():
        if name in wrappers or is_generated(obj):
            continue
        if isinstance(obj, type):
            names = factories.class_group_params(obj)
            if names:
                use(name, factories.make_class(obj, names))
            continue
        if not isinstance(obj, types.FunctionType):
            continue
        signature = signature_of(obj)
        names = group_params(signature) if signature is not None else ()
        target = helpers.get(name)
        if names:
            use(
                name,
                generate(
                    obj,
                    target=target,
                    signature=signature,
                    group_names=names,
                    native_type=native,
                    unwrap=unwrap,
                    fast_type=ReloadableProcessGroup,
                ),
            )
        elif target is not None:
            use(name, target)
    return PatchState(originals, wrappers)


def _apply(dist: types.ModuleType, patch: PatchState) -> None:
    done: list[str] = []
    try:
        for name, wrapper in patch.wrappers.items():
            setattr(dist, name, wrapper)
            done.append(name)
    except BaseException:
        for name in done:
            setattr(dist, name, patch.originals[name])
        raise


def monkey_patch_torch_dist(rebind_prefixes: str | Iterable[str] | None = None) -> None:
    """Patch ``torch.distributed`` once per process, then rebind stale references.

    Safe to call any number of times: later calls only repeat the sweep. ``rebind_prefixes``
    chooses the modules the sweep visits (default ``("megatron",)``; ``"*"`` for all).
    """
    global _STATE
    from . import sweep

    prefixes = sweep.parse_prefixes(rebind_prefixes)
    with _LOCK:
        if _STATE is None:
            import torch.distributed as dist

            if not dist.is_available():
                logger.warning(
                    "torch.distributed is not available in this torch build; not patching"
                )
                return
            _inject_failure_if_asked()
            patch = _build(dist)
            _apply(dist, patch)
            _STATE = patch
            logger.info("patched %d torch.distributed functions", len(patch.wrappers))
    changed = sweep.rebind(prefixes)
    if changed:
        logger.info("rebound %d stale references to torch.distributed functions", len(changed))


def patched_names() -> list[str]:
    """The ``torch.distributed`` names this process's patch replaced."""
    return sorted(_STATE.wrappers) if _STATE is not None else []
