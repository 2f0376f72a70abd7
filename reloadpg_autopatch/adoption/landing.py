"""When the patch lands: the lifecycle modules imported before it are handed to the adoption.

The patch usually lands inside ``import torch``, before any framework module exists, and the
start-up watcher hands each one over as it finishes importing (``handling.on_import``). A
module imported before the patch (an explicit ``monkey_patch_torch_dist()`` after the actor's
imports, or activation that finds ``torch.distributed`` imported) is handed over when the patch
lands, with the bindings other modules made of its names (``adopt_loaded``).

The package's public ``monkey_patch_torch_dist`` is the patch (``patching.apply.patch``) and
then this step, so it lives here, above both: the patching layer never imports the adoption.
Start-up does the same (``_startup.landing.patch``), importing this module only where such
a module is loaded. The rest of the adoption is imported only when a module is handed over.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .switch import modules

if TYPE_CHECKING:
    from .seen import Adoption

logger = logging.getLogger("reloadpg_autopatch")


def monkey_patch_torch_dist(rebind_prefixes: str | Iterable[str] | None = None) -> None:
    """Patch ``torch.distributed`` once per process, then rebind stale references.

    Safe to call any number of times: later calls only repeat the sweep. ``rebind_prefixes``
    chooses the modules the sweep visits (default ``("megatron",)``; ``"*"`` for all). A
    framework's lifecycle module imported before is adopted now (``adopt_loaded``).
    """
    from ..patching import apply

    apply.patch(rebind_prefixes)
    after_patch()


def after_patch() -> None:
    """Adopt the lifecycle modules imported before the patch; a failure leaves the patch
    standing and the framework with its own lifecycle, said once on the logger."""
    try:
        adopt_loaded()
    except Exception as error:
        logger.warning("adopting the frameworks' lifecycle modules failed: %s", error)


def adopt_loaded() -> list[Adoption]:
    """Adopt the lifecycle modules already imported (the patch calls this when it lands)."""
    done = []
    for name in modules():
        module = sys.modules.get(name)
        spec = getattr(module, "__spec__", None)
        if module is None or getattr(spec, "_initializing", False):
            continue  # not imported, or mid-import: the watcher sees it when it is done
        from .handling import handle  # only now: a module is there to hand over

        adoption = handle(module, elsewhere=True)
        if adoption is not None:
            done.append(adoption)
    return done
