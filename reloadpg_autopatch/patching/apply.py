"""Patch ``torch.distributed`` so every group-taking function accepts reloadable groups.

The set of functions is derived from the installed torch: every callable of the
``torch.distributed`` namespace with a process-group parameter (``rule``), so the renamed
``all_gather_single`` of torch 2.13 and a future torch's additions are covered the day it is
installed (the doctor prints how many this torch has).

Where torch keys on identity, it gets what it expects. Each wrapper is installed in the
namespace and also in ``distributed_c10d`` where torch defines the function, so that ``from
torch.distributed.distributed_c10d import all_reduce`` gets it, torch's own comparisons (``op
in (isend, irecv)``, Dynamo's ``fn is dist.all_reduce``) agree, and pickle finds each wrapper
under its ``__module__`` and ``__qualname__``. The one exception is a helper every collective
calls (``_HOT_HELPERS``), which needs no unwrapping anyway. Dynamo learns the wrappers through
its remap table (``dynamo``), and torch's own modules that bound the originals at import are
swept (``sweep.rebind_torch``).
"""

from __future__ import annotations

import logging
import os
import types
from collections.abc import Iterable
from typing import Any

from .. import _env, _originals
from . import dynamo, install, patchset, sweep

logger = logging.getLogger("reloadpg_autopatch")

#: Test switch: makes the patch raise, to prove that a failure never breaks the host.
FAIL_ENV = _env.FAIL_ENV

NAMESPACE = "torch.distributed"
C10D = "torch.distributed.distributed_c10d"

#: Left torch's own in distributed_c10d: every collective calls it with the group it has,
#: and it only compares that group with NON_GROUP_MEMBER, which a reloadable group is not.
_HOT_HELPERS = frozenset({"_rank_not_in_group"})


def _inject_failure_if_asked() -> None:
    raw = os.environ.get(FAIL_ENV, "")
    if raw.strip().lower() == "patch":
        raise RuntimeError(f"failure injected by {FAIL_ENV}=patch")
    problem = _env.failure_problem(raw)
    if problem is not None and _env.first_report(FAIL_ENV, raw):
        logger.warning("%s", problem)


def _build(dist: types.ModuleType) -> patchset.PatchSet:
    from ..groups.unwrap import failed, failed_native, unwrap
    from ..groups.ways.wrapper import ReloadableProcessGroup
    from . import classes, factories, helpers
    from .rule import class_group_params, function_group_params
    from .wrapgen import generate, is_generated

    native = dist.ProcessGroup
    taken = _originals.snapshot()
    snapshot, c10d_snapshot = taken["namespace"], taken["c10d"]
    originals: dict[str, Any] = {}
    wrappers: dict[str, Any] = {}

    def use(name: str, wrapper: Any) -> None:
        originals[name] = snapshot[name]
        wrappers[name] = wrapper

    new_group = snapshot["new_group"]
    use("new_group", factories.make_new_group(new_group, dist, outermost_check=True))
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
        names = function_group_params(obj)
        target = clones.get(name)
        if names:
            use(
                name,
                generate(
                    obj,
                    target=target,
                    group_names=names,
                    native_type=native,
                    unwrap=unwrap,
                    fast_type=ReloadableProcessGroup,
                    on_error=failed,
                    on_native_error=failed_native,
                ),
            )
        elif target is not None:
            use(name, target)

    # The same wrappers where torch defines them. new_group there has no outer layer above it
    # (torch's own modules call it directly), so it is a copy that always wraps.
    in_c10d: dict[str, Any] = {}
    for name, wrapper in wrappers.items():
        if name in _HOT_HELPERS or c10d_snapshot.get(name) is not originals[name]:
            continue
        in_c10d[name] = (
            factories.make_new_group(new_group, dist, outermost_check=False)
            if name == "new_group"
            else wrapper
        )
    for name, wrapper in wrappers.items():
        _home(wrapper, C10D if in_c10d.get(name) is wrapper else NAMESPACE)
    for wrapper in in_c10d.values():
        _home(wrapper, C10D)
    lifecycle = frozenset({"new_group", "destroy_process_group", *clones})
    return patchset.PatchSet(originals, wrappers, in_c10d, lifecycle & set(wrappers))


def _teach_the_lifecycle() -> None:
    """What torch's classes learn only when the lifecycle needs it: groups that keep torch's
    own object copy as handles (``classes.copy_as_handle``), from the first one handed out."""
    from ..groups import torch_class
    from . import classes

    torch_class.when_handed(classes.copy_as_handle)


def _home(wrapper: Any, module: str) -> None:
    """Make ``module`` + ``__qualname__`` find ``wrapper`` (pickle looks functions up so)."""
    wrapper.__module__ = module


def patch(
    rebind_prefixes: str | Iterable[str] | None = None, *, load_dynamo_table: bool = True
) -> None:
    """Patch ``torch.distributed`` once per process, then rebind stale references.

    Safe to call any number of times: later calls only repeat the sweep. ``rebind_prefixes``
    chooses the modules the sweep visits (default ``("megatron",)``; ``"*"`` for all). At
    start-up Dynamo's table is not imported just for us. The public ``monkey_patch_torch_dist``
    is this, then the adoption of the frameworks' modules loaded before it (``adoption``, the
    layer above this one).
    """
    prefixes = sweep.parse_prefixes(rebind_prefixes)
    with patchset.LOCK:
        if patchset.current() is None:
            import torch.distributed as dist

            if not dist.is_available():
                logger.warning(
                    "torch.distributed is not available in this torch build; not patching"
                )
                return
            _inject_failure_if_asked()
            built = _build(dist)
            install.apply(
                built, set(built.lifecycle) if install.lifecycle_only() else set(built.wrappers)
            )
            patchset.set_current(built)
            _originals.note_patched()
            install.guard_splits()
            _teach_the_lifecycle()
            dynamo.register(built, load=load_dynamo_table)
            rebound = sweep.rebind_torch()
            logger.info(
                "patched %d torch.distributed functions (%d also in distributed_c10d); "
                "rebound %d bindings in torch's own modules",
                len(built.installed),
                len(built.installed & set(built.c10d)),
                len(rebound),
            )
    changed = sweep.rebind(prefixes)
    if changed:
        logger.info("rebound %d stale references to torch.distributed functions", len(changed))
