"""Patch ``torch.distributed`` so every group-taking function accepts reloadable groups.

The set of functions is derived from the installed torch: every callable of the
``torch.distributed`` namespace with a process-group parameter (``rule.group_params``), so the
renamed ``all_gather_single`` and ``reduce_scatter_single`` of torch 2.13, which slime's
hand-kept list lacks, and a future torch's additions are covered the day it is installed. The
doctor prints how many this torch has.
"""

from __future__ import annotations

import logging
import os
import types
from collections.abc import Iterable
from typing import Any

from .. import _originals
from . import state, sweep

logger = logging.getLogger("reloadpg_autopatch")

#: Test switch: makes the patch raise, to prove that a failure never breaks the host.
FAIL_ENV = "SLIME_RELOADABLE_PG_INJECT_FAILURE"


def _inject_failure_if_asked() -> None:
    if os.environ.get(FAIL_ENV, "").strip().lower() == "patch":
        raise RuntimeError(f"failure injected by {FAIL_ENV}=patch")


def _build(dist: types.ModuleType) -> state.PatchState:
    from ..groups.reloadable import ReloadableProcessGroup
    from ..groups.unwrap import unwrap
    from . import classes, factories, helpers
    from .rule import class_group_params, group_params, signature_of
    from .wrapgen import generate, is_generated

    native = dist.ProcessGroup
    snapshot = _originals.snapshot()["namespace"]
    originals: dict[str, Any] = {}
    wrappers: dict[str, Any] = {}

    def use(name: str, wrapper: Any) -> None:
        originals[name] = snapshot[name]
        wrappers[name] = wrapper

    use("new_group", factories.make_new_group(snapshot["new_group"], dist))
    use(
        "destroy_process_group",
        factories.make_destroy_process_group(snapshot["destroy_process_group"]),
    )
    clones = helpers.make_helpers(snapshot, helpers.discover_helpers(snapshot), dist)

    for name, obj in snapshot.items():
        if name in wrappers or is_generated(obj):
            continue
        if isinstance(obj, type):
            names = class_group_params(obj)
            if names:
                use(name, classes.make_class(obj, names))
            continue
        if not isinstance(obj, types.FunctionType):
            continue
        signature = signature_of(obj)
        names = group_params(signature) if signature is not None else ()
        target = clones.get(name)
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
    return state.PatchState(originals, wrappers)


def _apply(dist: types.ModuleType, patch: state.PatchState) -> None:
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
    prefixes = sweep.parse_prefixes(rebind_prefixes)
    with state.LOCK:
        if state.current() is None:
            import torch.distributed as dist

            if not dist.is_available():
                logger.warning(
                    "torch.distributed is not available in this torch build; not patching"
                )
                return
            _inject_failure_if_asked()
            patch = _build(dist)
            _apply(dist, patch)
            state.set_current(patch)
            logger.info("patched %d torch.distributed functions", len(patch.wrappers))
    changed = sweep.rebind(prefixes)
    if changed:
        logger.info("rebound %d stale references to torch.distributed functions", len(changed))
