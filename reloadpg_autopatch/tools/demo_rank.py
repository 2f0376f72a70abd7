"""One rank of the demo: build groups, check collectives, destroy and reload them K times.

Run by ``demo`` through ``launch``, each rank a fresh interpreter with the gate on, so the
``.pth`` has patched ``torch.distributed`` before Megatron is imported. With megatron-core
installed it builds Megatron's own groups and checks collectives through the functions Megatron
bound at import time; without it, plain torch groups. Every mismatch raises with the rank, the
collective and the two values.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from . import launch


class Mismatch(AssertionError):
    """A collective gave a wrong result."""


class InjectedFailure(RuntimeError):
    """The failure ``--inject-failure`` asks for: a rank raising mid-run, as a real bug would."""


def _expect(label: str, got: Any, want: Any) -> None:
    if got != want:
        raise Mismatch(f"{label}: got {got}, expected {want}")


def _activation() -> str:
    from .. import _startup
    from ..adoption import landing
    from ..patching import patchset

    started_by_site = _startup.status()["source"] == "site"
    import torch.distributed  # noqa: F401 - with the .pth active, this is what patches

    if started_by_site:
        if not patchset.is_patched():
            raise RuntimeError("the .pth activated at start-up, but torch.distributed is unpatched")
        return "pth"
    # Not installed with its .pth in this interpreter: patch late and let the sweep work.
    landing.monkey_patch_torch_dist()
    return "late"


class _Groups:
    """The groups a rank uses: TP pairs, DP, and for the coalesced path the DP group."""

    def __init__(self, tp: Any, dp: Any, extra: dict[str, Any], tp_size: int) -> None:
        self.tp, self.dp, self.extra, self.tp_size = tp, dp, extra, tp_size


def _megatron_groups(world_size: int) -> _Groups:
    from megatron.core import parallel_state

    tp_size = 2 if world_size % 2 == 0 else 1
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp_size)
    return _Groups(
        parallel_state.get_tensor_model_parallel_group(),
        parallel_state.get_data_parallel_group(),
        {
            "pp": parallel_state.get_pipeline_model_parallel_group(),
            "mp": parallel_state.get_model_parallel_group(),
            "dp_cp": parallel_state.get_data_parallel_group(with_context_parallel=True),
        },
        tp_size,
    )


def _plain_groups(world_size: int) -> _Groups:
    import torch.distributed as dist

    tp_size = 2 if world_size % 2 == 0 else 1
    tp, _ = dist.new_subgroups(tp_size)
    dp_lists = [list(range(i, world_size, tp_size)) for i in range(tp_size)]
    dp, _ = dist.new_subgroups_by_enumeration(dp_lists)
    return _Groups(tp, dp, {"world_copy": dist.new_group()}, tp_size)


def _bound_functions(use_megatron: bool) -> dict[str, Any]:
    import torch.distributed as dist

    if not use_megatron:
        return {
            "all_gather": dist.all_gather_into_tensor,
            "reduce_scatter": dist.reduce_scatter_tensor,
            "coalescing_manager": dist._coalescing_manager,
            "dp_all_gather": dist.all_gather_into_tensor,
        }
    from megatron.core.distributed import param_and_grad_buffer
    from megatron.core.tensor_parallel import mappings

    return {
        "all_gather": mappings.dist_all_gather_func,
        "reduce_scatter": mappings.dist_reduce_scatter_func,
        "coalescing_manager": param_and_grad_buffer._coalescing_manager,
        "dp_all_gather": param_and_grad_buffer.dist_all_gather_func,
        "dp_reduce_scatter": param_and_grad_buffer.dist_reduce_scatter_func,
    }


def _collectives(groups: _Groups, fns: dict[str, Any], device: Any) -> int:
    """Run and check the collectives; returns how many were checked."""
    import torch
    import torch.distributed as dist

    def full(n: int, value: float) -> Any:
        return torch.full((n,), value, device=device)

    checked = 0
    for name, group in (("tp", groups.tp), ("dp", groups.dp)):
        size = dist.get_world_size(group)
        ranks = dist.get_process_group_ranks(group)
        me = dist.get_rank()
        out = full(2 * size, 0.0)
        fns["all_gather"](out, full(2, float(me)), group=group)
        _expect(f"all_gather on {name}", out.tolist(), [float(r) for r in ranks for _ in (0, 1)])
        shard = full(1, 0.0)
        fns["reduce_scatter"](shard, torch.arange(float(size), device=device) + me, group=group)
        index = dist.get_group_rank(group, me)
        _expect(f"reduce_scatter on {name}", shard.item(), float(sum(ranks) + size * index))
        checked += 2

    # The way param_and_grad_buffer overlaps its bucket communication.
    size = dist.get_world_size(groups.dp)
    ranks = dist.get_process_group_ranks(groups.dp)
    me = dist.get_rank()
    gathered = full(2 * size, 0.0)
    with fns["coalescing_manager"](groups.dp, async_ops=True) as manager:
        fns["dp_all_gather"](gathered, full(2, float(me)), group=groups.dp, async_op=True)
    manager.wait()
    _expect(
        "coalesced all_gather on dp", gathered.tolist(), [float(r) for r in ranks for _ in (0, 1)]
    )
    checked += 1
    if "dp_reduce_scatter" in fns:
        shard = full(1, 0.0)
        with fns["coalescing_manager"](groups.dp, async_ops=True) as manager:
            fns["dp_reduce_scatter"](shard, full(size, 1.0), group=groups.dp, async_op=True)
        manager.wait()
        _expect("coalesced reduce_scatter on dp", shard.item(), float(size))
        checked += 1

    for name, group in [("world", None), *groups.extra.items()]:
        t = full(1, 1.0)
        dist.all_reduce(t, group=group)
        _expect(f"all_reduce on {name}", t.item(), float(dist.get_world_size(group)))
        checked += 1
    return checked


_FOUND: list[Any] = []


def _bindings(use_megatron: bool) -> dict[str, int]:
    if not use_megatron:
        return {"found": 0, "patched": 0}
    from .bindings import check, find_bindings

    if not _FOUND:
        _FOUND.extend(find_bindings("megatron.core"))  # read the source once per rank
    result = check(_FOUND)
    group_taking = len(result["patched"]) + len(result["stale"]) + len(result["unimportable"])
    from ..patching import patchset

    if not patchset.current().complete:
        # Native mode: every group is torch's own, so the bindings are right as torch's.
        return {"found": group_taking, "patched": 0, "native": group_taking}
    if result["stale"]:
        names = ", ".join(f"{b.module}.{b.attribute}" for b in result["stale"])
        raise Mismatch(f"Megatron bindings still unpatched: {names}")
    return {"found": group_taking, "patched": len(result["patched"])}


def _megatron() -> str | None:
    """megatron-core's version if it imports here, else None (plain torch groups then)."""
    try:
        import megatron.core
    except ImportError:
        return None
    # The distribution's version: megatron-core 0.19.2's __version__ appends the commit of
    # whatever git checkout holds the installed package (a venv inside a clone: that clone's).
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("megatron-core")
    except PackageNotFoundError:  # imported from a source tree
        return str(getattr(megatron.core, "__version__", "unknown"))


def _free_mib(device: Any) -> float | None:
    """Free accelerator memory in MiB (None on CPU): what destroying the groups gives back."""
    if device.type != "cuda":
        return None
    import torch

    torch.cuda.synchronize(device)
    return torch.cuda.mem_get_info(device)[0] / 2**20


def _pg_count() -> int:
    from torch.distributed import distributed_c10d

    return len(distributed_c10d._world.pg_map)


def run(args: Any) -> None:
    activation = _activation()
    megatron_version = _megatron()
    use_megatron = megatron_version is not None
    import torch

    device = torch.device("cpu")
    if args.backend in ("nccl", "nccl2"):
        device = torch.device("cuda", args.rank % max(torch.cuda.device_count(), 1))
        torch.cuda.set_device(device)
    launch.init_rank(args, backend=args.backend, timeout=args.timeout)
    import torch.distributed as dist

    from ..groups import lifecycle
    from ..groups.store import channel
    from ..groups.world import registration

    # On gloo, treat gloo as the accelerator so that WORLD takes part in every cycle too.
    registration.register_default_process_group(accelerator_backends=(args.backend,))
    groups = _megatron_groups(args.world_size) if use_megatron else _plain_groups(args.world_size)
    fns = _bound_functions(use_megatron)
    bindings = _bindings(use_megatron)
    reloadable = len(lifecycle.reloadable_groups())
    launch.emit(
        {
            "type": "ready",
            "activation": activation,
            "megatron": megatron_version,
            "tp": groups.tp_size,
            "groups": reloadable,
            "bindings": bindings,
            "collectives": _collectives(groups, fns, device),
        }
    )
    for cycle in range(1, args.cycles + 1):
        if args.inject_failure == args.rank and cycle == 1:
            raise InjectedFailure(
                f"rank {args.rank} failed on purpose in cycle {cycle} (--inject-failure "
                f"{args.inject_failure})"
            )
        free_live = _free_mib(device)
        started = time.perf_counter()
        lifecycle.destroy_process_groups()
        destroyed = time.perf_counter()
        free_destroyed = _free_mib(device)
        left = _pg_count()
        in_place = lifecycle.reloadable_groups() and all(
            type(g) is torch.distributed.ProcessGroup for g in lifecycle.reloadable_groups()
        )
        registered = channel.registration()
        world = registered.record if registered is not None else None
        asleep = world is not None and world.way.suspends
        if left != 1 and not in_place and not asleep:  # torch keeps in-place/suspended groups
            raise Mismatch(f"after destroy torch still holds {left} groups, expected WORLD only")
        lifecycle.reload_process_groups()
        reloaded = time.perf_counter()
        launch.emit(
            {
                "type": "cycle",
                "cycle": cycle,
                "groups": len(lifecycle.reloadable_groups()),
                "destroy_ms": (destroyed - started) * 1e3,
                "reload_ms": (reloaded - destroyed) * 1e3,
                "collectives": _collectives(groups, fns, device),
                "bindings": _bindings(use_megatron),
                "free_mib": [free_live, free_destroyed, _free_mib(device)],
                "report": lifecycle.last_cycle_report().to_dict(),
            }
        )
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = launch.rank_parser("one rank of python -m reloadpg_autopatch demo")
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--inject-failure", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=120.0, help="for joining WORLD")
    args = parser.parse_args(argv)
    try:
        run(args)
    except Exception as error:
        launch.fail(error)
    launch.emit({"type": "done"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
