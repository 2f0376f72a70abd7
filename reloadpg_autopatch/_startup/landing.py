"""What runs once ``torch.distributed`` is imported: the patch, and the watchers' callbacks.

torch has loaded logging and everything else by then, so nothing here counts against start-up.
A failure here raises: the start-up module (``_startup.patch_now`` and its callbacks) says it
once and lets the import go on.
"""

import os
import sys

from .._env import ADOPT_MODULES_ENV, parse_adopt_modules
from .problems import log_level, valid_rebind_prefixes


def _configure_logging() -> None:
    level = log_level()
    if level is None:
        return
    import logging

    logger = logging.getLogger("reloadpg_autopatch")
    logger.setLevel(level)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("reloadpg_autopatch %(levelname)s: %(message)s"))
        logger.addHandler(handler)


def patch(on_dynamo_import: object) -> None:
    """Apply the patch and sweep, adopt the lifecycle modules already loaded; call
    ``on_dynamo_import`` once torch.compile's module has executed (at once if it has)."""
    _configure_logging()
    from ..patching import apply, dynamo

    apply.patch(valid_rebind_prefixes(), load_dynamo_table=False)
    adopt_loaded()
    if dynamo.MODULE not in sys.modules:
        from _reloadpg_autopatch_boot import install

        install(dynamo.MODULE, on_dynamo_import)


def register_with_dynamo() -> None:
    """Tell torch.compile which calls the patch wraps (without loading its tables)."""
    from ..patching import dynamo

    dynamo.register(load=False)


def error_logger() -> object:
    """The package's logger where the user configured one, else None (say it on stderr)."""
    import logging

    logger = logging.getLogger("reloadpg_autopatch")
    return logger if logger.hasHandlers() else None


def rebind_on_import(module: object) -> None:
    """Sweep a module under ``SLIME_RELOADABLE_PG_REBIND`` as soon as it has executed."""
    if "reloadpg_autopatch.patching.patchset" not in sys.modules:
        return  # not patched yet: the patch sweeps every module already loaded
    from ..patching import sweep

    sweep.rebind_module(module)


def adopt_on_import(module: object) -> None:
    """A framework's lifecycle module has executed: adopt it before anyone imports from it."""
    if "reloadpg_autopatch.patching.patchset" not in sys.modules:
        return  # not patched yet: the patch adopts every such module already loaded
    from ..adoption import handling

    handling.on_import(module)


def adopt_loaded() -> None:
    """The patch has landed: adopt the lifecycle modules imported before it. The adoption is
    imported only where one is loaded (the patch usually lands inside ``import torch``, before
    any framework module exists)."""
    watched = parse_adopt_modules(os.environ.get(ADOPT_MODULES_ENV))[0]
    if not any(name in sys.modules for name in watched):
        return
    from ..adoption import landing

    landing.after_patch()
