"""A fork's lifecycle module under a name of its own (``forkrl.lifecycle``).

No default adopts it: only ``SLIME_RELOADABLE_PG_ADOPT_MODULES=forkrl.lifecycle`` does. Its
four functions only record that they ran (``calls``), so a test can see whether a call reached
them or the package's lifecycle.
"""

from datetime import timedelta

import torch.distributed  # noqa: F401 - a lifecycle module imports it, as the frameworks' do

calls: list = []


def monkey_patch_torch_dist() -> None:
    calls.append("monkey_patch_torch_dist")


def register_default_process_group(timeout: timedelta) -> None:
    calls.append("register_default_process_group")


def destroy_process_groups() -> None:
    calls.append("destroy_process_groups")


def reload_process_groups() -> None:
    calls.append("reload_process_groups")
