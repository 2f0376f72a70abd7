"""vime's canonical Gloo group, as slime's before its weight-update helpers moved (see
``slime.utils.distributed_utils``): made once with ``torch.distributed.old_new_group`` when the
lifecycle patch ran, replaced by ``set_gloo_group``. Written for this project from notes."""

import torch.distributed as dist

GLOO_GROUP = None


def init_gloo_group():
    global GLOO_GROUP
    if GLOO_GROUP is None:
        GLOO_GROUP = getattr(dist, "old_new_group", dist.new_group)(backend="gloo")
    return GLOO_GROUP


def get_gloo_group():
    if GLOO_GROUP is None:
        raise RuntimeError("Gloo group has not been initialized. Call init_gloo_group() first.")
    return GLOO_GROUP


def set_gloo_group(group):
    global GLOO_GROUP
    GLOO_GROUP = group
