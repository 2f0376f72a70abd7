"""What a framework's patch does besides its lifecycle, kept when its module is adopted.

The framework's own patch never runs once its module is adopted, so its class never holds a
group; what that patch does besides its lifecycle is done here instead: the rewrite of the
backend its ``new_group`` applies (slime's accelerator, PR #2216: ``nccl`` to ``mccl`` on MUSA),
and ``torch.distributed.old_new_group``, which slime's ``init_gloo_group`` reads. Whether the
framework's patch ran already (then its lifecycle stays) is read here too.
"""

from __future__ import annotations

import os
from typing import Any

from ..patching import factories, patchset


def _backend_rewrite(module: Any) -> tuple[str, Any] | None:
    """slime's ``new_group`` (PR #2216) asks its accelerator for the backend to use where
    ``"nccl"`` is asked for (``mccl`` on MUSA): the same rewrite, from the module's own
    ``accelerator``, and the doctor's words for it. None for a module without one."""
    import torch.distributed as dist

    accelerator = vars(module).get("accelerator")
    choose = getattr(accelerator, "process_group_backend", None)
    if not callable(choose):
        return None
    label = f"{getattr(accelerator, '__name__', module.__name__ + '.accelerator')}."
    label += "process_group_backend"

    def rewrite(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        explicit = args[2] if len(args) > 2 else kwargs.get("backend")
        if explicit is None and not dist.is_initialized():
            return args, kwargs  # torch says what is wrong
        backend = str(explicit) if explicit is not None else str(dist.get_backend())
        if backend != "nccl":
            return args, kwargs
        chosen = choose(backend)
        if chosen == backend:
            return args, kwargs
        if len(args) > 2:
            return (*args[:2], chosen, *args[3:]), kwargs
        return args, {**kwargs, "backend": chosen}

    try:
        now = f" (now {choose('nccl')!r})"
    except Exception as error:  # its accelerator cannot tell yet: say so, rewrite at creation
        now = f" (its accelerator could not tell yet: {error})"
    return f"new_group's backend 'nccl' rewritten by {label}{now}", rewrite


def _old_new_group() -> Any:
    """What ``torch.distributed.old_new_group`` is where adoption sets it: the package's
    ``new_group`` as torch's own modules reach it, the one a framework's patch applied on top of
    the package records (slime's ``init_gloo_group`` makes its Gloo group with it)."""
    patch = patchset.current()
    target = patch.c10d.get("new_group") or patch.wrappers["new_group"]

    def old_new_group(*args: Any, **kwargs: Any) -> Any:
        return target(*args, **kwargs)

    setattr(old_new_group, factories.ADOPTED_DECLARATION, True)
    old_new_group.__doc__ = "torch.distributed.new_group, as it was before the framework's patch"
    return old_new_group


def keep(module: Any) -> list[str]:
    """Do what the framework's patch does besides its lifecycle; say what."""
    import torch.distributed as dist

    kept = []
    rewrite = _backend_rewrite(module)
    if rewrite is not None:
        factories.REWRITES[module.__name__] = rewrite[1]
        kept.append(rewrite[0])
    if not callable(vars(module).get("monkey_patch_torch_dist")):
        return kept
    if getattr(dist, factories.SLIME_DECLARATION, None) is None:
        setattr(dist, factories.SLIME_DECLARATION, _old_new_group())
    kept.append(f"torch.distributed.{factories.SLIME_DECLARATION}")
    return kept


def drop(module: Any) -> None:
    """The framework's lifecycle stays: its own ``new_group`` rewrites, if its patch runs."""
    factories.REWRITES.pop(module.__name__, None)


def their_patch_ran(module: Any) -> bool:
    """Whether a framework's ``monkey_patch_torch_dist`` already patched this process (an
    ``old_new_group`` adoption set says nothing of the kind)."""
    import torch.distributed as dist

    declared = getattr(dist, factories.SLIME_DECLARATION, None)
    if declared is not None and not getattr(declared, factories.ADOPTED_DECLARATION, False):
        return True
    recorded = vars(module).get("old_new_group_dict")
    return isinstance(recorded, dict) and os.getpid() in recorded
