"""A fork's lifecycle module that imports torch only inside its functions (``forkrl.lazy``).

Imported before ``torch.distributed``, it has finished executing before the patch exists, so
the start-up watcher cannot adopt it then; the patch, when it lands, must. Only
``SLIME_RELOADABLE_PG_ADOPT_MODULES=forkrl.lazy`` makes the package adopt it. Its functions
only record that they ran (``calls``).
"""

from datetime import timedelta

calls: list = []


def monkey_patch_torch_dist() -> None:
    import torch.distributed  # noqa: F401 - a lazy fork imports torch when it is called

    calls.append("monkey_patch_torch_dist")


def register_default_process_group(timeout: timedelta) -> None:
    calls.append("register_default_process_group")


def destroy_process_groups() -> None:
    calls.append("destroy_process_groups")


def reload_process_groups() -> None:
    calls.append("reload_process_groups")
