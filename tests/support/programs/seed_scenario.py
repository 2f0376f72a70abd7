"""The bug this package exists for, on real Megatron bindings (run as a rank by the launcher).

Megatron is imported first, a slime-like patch lands late and wraps the groups, then Megatron's
bound ``dist_all_gather_func`` gets such a group. ``--mode``:
``plain`` (no package at work) must fail; ``gate`` (SLIME_RELOADABLE_PG=1 at start-up) and
``late`` (``monkey_patch_torch_dist()`` after the Megatron import: the sweep does the work)
must give the right result.
"""

from __future__ import annotations

import sys

import slime_like  # next to this file, which is sys.path[0]

from reloadpg_autopatch.tools import launch


def _chain(error: BaseException | None) -> str:
    parts = []
    while error is not None:
        parts.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    return " <- ".join(parts)


def main() -> int:
    parser = launch.rank_parser(__doc__)
    parser.add_argument("--mode", choices=("plain", "gate", "late"), required=True)
    args = parser.parse_args()
    import warnings

    warnings.simplefilter("ignore", FutureWarning)
    from megatron.core.tensor_parallel import mappings  # Megatron binds first

    if args.mode == "late":
        import reloadpg_autopatch

        reloadpg_autopatch.monkey_patch_torch_dist()
    import torch
    import torch.distributed as dist

    launch.init_rank(args)
    slime_like.apply()
    group = dist.new_group([0, 1])
    out = torch.zeros(4)
    result = {"type": "result", "group": type(group).__name__}
    try:
        mappings.dist_all_gather_func(out, torch.full((2,), float(args.rank)), group=group)
        result["gathered"] = out.tolist()
        result["error"] = None
    except Exception as error:
        result["gathered"] = None
        result["error"] = _chain(error)
    result["binding_is_ours"] = hasattr(mappings.dist_all_gather_func, "__reloadpg_autopatch__")
    launch.emit(result)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
