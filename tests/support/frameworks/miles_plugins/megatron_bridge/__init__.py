"""miles' Megatron-Bridge plugin: its pipeline-group shim, as the tests need it.

Written for this project from the notes on miles' public source. At import it binds
``ReloadableProcessGroup`` from miles' lifecycle module and wraps
``MegatronParamMapping.broadcast_obj_from_pp_rank``: when ``self.pp_group`` is an instance of
that class, the shim puts the wrapper's ``.group`` in its place for the call (torch's maps do not
know miles' wrapper) and puts the wrapper back after. A failure to install only logs.
"""

import functools
import logging

logger = logging.getLogger(__name__)


def _install_bridge_pp_group_unwrap() -> None:
    from bridge_shaped import MegatronParamMapping
    from miles.utils.reloadable_process_group import ReloadableProcessGroup

    if getattr(MegatronParamMapping, "_miles_pp_group_unwrap_installed", False):
        return
    original = MegatronParamMapping.broadcast_obj_from_pp_rank

    @functools.wraps(original)
    def broadcast_obj_from_pp_rank(self, obj, name=None):
        wrapper = self.pp_group
        if not isinstance(wrapper, ReloadableProcessGroup):
            return original(self, obj, name)
        self.pp_group = wrapper.group
        try:
            return original(self, obj, name)
        finally:
            self.pp_group = wrapper

    MegatronParamMapping.broadcast_obj_from_pp_rank = broadcast_obj_from_pp_rank
    MegatronParamMapping._miles_pp_group_unwrap_installed = True


try:
    _install_bridge_pp_group_unwrap()
except Exception as error:  # miles only warns
    logger.warning("could not install the Megatron-Bridge pp-group shim: %s", error)
