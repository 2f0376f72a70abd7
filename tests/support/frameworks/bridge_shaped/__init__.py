"""Megatron-Bridge's ``MegatronParamMapping``, reduced to the one method miles' plugin wraps.

``broadcast_obj_from_pp_rank`` broadcasts an object from the pipeline stage that holds it,
through ``torch.distributed.broadcast_object_list`` on ``self.pp_group``: torch looks the group
up in its own maps (``get_global_rank``), so a group torch does not know is refused ("Group ...
is not registered"). Written for this project; Megatron-Bridge is not installed here.
"""

from typing import Any

import torch.distributed as dist


class MegatronParamMapping:
    def __init__(self, pp_group: Any) -> None:
        self.pp_group = pp_group

    def broadcast_obj_from_pp_rank(self, obj: Any, name: Any = None) -> Any:
        source = dist.get_global_rank(self.pp_group, 0)
        box = [obj]
        dist.broadcast_object_list(box, src=source, group=self.pp_group)
        return box[0]
