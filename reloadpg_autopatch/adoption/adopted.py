"""The lifecycle a framework's names are pointed at when its module is adopted.

- ``monkey_patch_torch_dist()``: a no-op, the patch is active already;
- ``register_default_process_group(timeout)``: the package's, asking nothing of the framework
  (its Gloo group, made before registration, is left alone by WORLD's swap as every group the
  package did not make is: ``groups.world.carry``);
- ``destroy_process_groups()``, ``reload_process_groups()``: the package's.
"""

from __future__ import annotations

from typing import Any


def monkey_patch_torch_dist() -> None:
    """A framework's ``monkey_patch_torch_dist``, adopted: the patch is already active."""


def ours() -> dict[str, Any]:
    """``{framework's name: what it is pointed at}``, for each of ``_env.ADOPTED_NAMES``."""
    # The lifecycle's modules load with the first module adopted, not with the patch (which
    # runs inside ``import torch``), as they load with the first group (``factories``).
    from ..groups import lifecycle

    return {
        "monkey_patch_torch_dist": monkey_patch_torch_dist,
        "register_default_process_group": lifecycle.register_default_process_group,
        "destroy_process_groups": lifecycle.destroy_process_groups,
        "reload_process_groups": lifecycle.reload_process_groups,
    }
