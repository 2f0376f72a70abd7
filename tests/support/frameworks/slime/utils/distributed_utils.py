"""slime's canonical Gloo group: ``init_gloo_group()``, ``get_gloo_group()``, ``set_gloo_group()``.

As in slime, the group is made with the ``new_group`` its lifecycle patch replaced
(``torch.distributed.old_new_group``) when that patch ran, so that it stays raw; the actor and
the lifecycle read it through ``get_gloo_group()`` each time they need it.
"""

import torch.distributed as dist

GLOO_GROUP = None


def init_gloo_group():
    """Create the canonical Gloo group (every rank of WORLD) and keep it."""
    global GLOO_GROUP
    GLOO_GROUP = getattr(dist, "old_new_group", dist.new_group)(backend="gloo")
    return GLOO_GROUP


def get_gloo_group():
    return GLOO_GROUP


def set_gloo_group(group):
    global GLOO_GROUP
    GLOO_GROUP = group
