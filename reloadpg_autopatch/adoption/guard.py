"""The guard over a framework's own patch, where its lifecycle stays.

With adoption off (``SLIME_RELOADABLE_PG_ADOPT=0``, a bad value, or the framework's patch ran
already), the framework's lifecycle stays, layered on the package's patch as before; its
``monkey_patch_torch_dist`` is wrapped (``guarded``) so that, once it has replaced
``torch.distributed``'s functions, each of those is put behind a guard that unwraps the
framework's wrapper first (``guard_their_functions``): one whose ``.group`` is None is refused
with ``GroupDestroyedError`` naming the group and the call, where the framework's own function
would hand torch ``None`` (read as WORLD).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from ..patching import patchset

logger = logging.getLogger("reloadpg_autopatch")

#: Set on a framework's ``monkey_patch_torch_dist`` that this module wrapped with the guard.
GUARDED = "__reloadpg_guarded__"


def guarded(original: Callable[..., Any]) -> Callable[..., Any]:
    """The framework's ``monkey_patch_torch_dist``, guarding what it replaced once it ran."""

    @functools.wraps(original)
    def guarded_monkey_patch_torch_dist(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        guard_their_functions()
        return result

    setattr(guarded_monkey_patch_torch_dist, GUARDED, True)
    return guarded_monkey_patch_torch_dist


def is_guarded(function: Any) -> bool:
    """Whether ``function`` is a framework's ``monkey_patch_torch_dist`` guarded here."""
    return bool(getattr(function, GUARDED, False))


def guard_their_functions() -> list[str]:
    """Put each ``torch.distributed`` function a framework replaced behind our unwrapping.

    The framework's function swaps its wrapper for ``.group`` with no None check; the guard,
    generated with torch's signature, unwraps first (the framework's wrapper included), so a
    destroyed one is refused and a live one reaches the framework's function as a native group.
    """
    import torch.distributed as dist

    from .. import _originals
    from ..groups.unwrap import failed, failed_native, unwrap
    from ..groups.ways.wrapper import ReloadableProcessGroup
    from ..patching.rule import function_group_params
    from ..patching.wrapgen import generate, is_generated

    patch = patchset.current()
    if patch is None:
        return []
    # torch's own functions, where torch defines them: the frameworks patch the namespace only,
    # and a patch applied after theirs took their functions for the namespace's originals.
    defined = _originals.snapshot()["c10d"]
    done = []
    with patchset.LOCK:
        for name, current in list(vars(dist).items()):
            original = defined.get(name)
            if original is None or isinstance(original, type) or name in patch.lifecycle:
                continue
            if current is original or current is patch.wrappers.get(name):
                continue
            if not callable(current) or is_generated(current):
                continue
            params = function_group_params(original)
            if not params:
                continue
            guard = generate(
                original,
                target=current,
                group_names=params,
                native_type=dist.ProcessGroup,
                unwrap=unwrap,
                fast_type=ReloadableProcessGroup,
                on_error=failed,
                on_native_error=failed_native,
            )
            setattr(dist, name, guard)
            done.append(name)
    if done:
        logger.info(
            "put %d functions a framework's patch replaced behind the guard: %s",
            len(done),
            ", ".join(sorted(done)),
        )
    return done
