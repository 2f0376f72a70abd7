"""miles' canonical Gloo group: made with ``dist.new_group(backend="gloo")``, which miles'
patched ``new_group`` leaves raw because the backend is named ``gloo``."""

import torch.distributed as dist

GLOO_GROUP = None


def init_gloo_group():
    global GLOO_GROUP
    GLOO_GROUP = dist.new_group(backend="gloo")
    return GLOO_GROUP


def get_gloo_group():
    return GLOO_GROUP
