"""Every gloo-supported collective, run on one group; shared by the collective and reload tests.

``exercise(group, rank)`` returns plain Python values so that the caller can compare a run on a
reloadable group with a run on its native group, and check them against ``expected(rank)``.
"""

from __future__ import annotations

from typing import Any


def exercise(group: Any, rank: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    peer = 1 - rank
    out: dict[str, Any] = {}

    t = torch.tensor([rank + 1.0, 2.0 * (rank + 1)])
    dist.all_reduce(t, group=group)
    out["all_reduce"] = t.tolist()

    t = torch.full((2,), float(rank))
    dist.broadcast(t, src=1, group=group)
    out["broadcast"] = t.tolist()

    gathered = [torch.zeros(2) for _ in range(2)]
    dist.all_gather(gathered, torch.full((2,), float(rank)), group=group)
    out["all_gather"] = [x.tolist() for x in gathered]

    for name in ("all_gather_into_tensor", "all_gather_single", "_all_gather_base"):
        buf = torch.zeros(4)
        getattr(dist, name)(buf, torch.full((2,), float(rank)), group=group)
        out[name] = buf.tolist()

    for name in ("reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base"):
        buf = torch.zeros(2)
        getattr(dist, name)(buf, torch.arange(4.0) + rank, group=group)
        out[name] = buf.tolist()

    buf = torch.zeros(2)
    dist.reduce_scatter(
        buf, [torch.full((2,), float(rank)), torch.full((2,), rank + 1.0)], group=group
    )
    out["reduce_scatter"] = buf.tolist()

    buf = torch.zeros(2)
    dist.all_to_all_single(buf, torch.tensor([10.0 * rank, 10.0 * rank + 1]), group=group)
    out["all_to_all_single"] = buf.tolist()

    parts = [torch.zeros(1) for _ in range(2)]
    dist.all_to_all(parts, [torch.tensor([rank * 1.0]), torch.tensor([rank + 10.0])], group=group)
    out["all_to_all"] = [x.item() for x in parts]

    t = torch.tensor([rank + 1.0])
    dist.reduce(t, dst=0, group=group)
    out["reduce"] = t.item() if rank == 0 else None

    gather_list = [torch.zeros(1) for _ in range(2)] if rank == 0 else None
    dist.gather(torch.tensor([rank + 5.0]), gather_list, dst=0, group=group)
    out["gather"] = [x.item() for x in gather_list] if gather_list else None

    t = torch.zeros(1)
    scatter_list = [torch.tensor([7.0]), torch.tensor([8.0])] if rank == 0 else None
    dist.scatter(t, scatter_list, src=0, group=group)
    out["scatter"] = t.item()

    objects: list[Any] = [None, None]
    dist.all_gather_object(objects, {"rank": rank}, group=group)
    out["all_gather_object"] = objects

    objects = [{"from": rank}]
    dist.broadcast_object_list(objects, src=0, group=group)
    out["broadcast_object_list"] = objects

    objects = [None, None] if rank == 0 else None
    dist.gather_object(f"obj{rank}", objects, dst=0, group=group)
    out["gather_object"] = objects

    objects = [None]
    dist.scatter_object_list(objects, ["a", "b"] if rank == 0 else None, src=0, group=group)
    out["scatter_object_list"] = objects

    if rank == 0:
        dist.send_object_list([{"k": 1}], dst=1, group=group)
        out["send_recv_object_list"] = None
    else:
        objects = [None]
        dist.recv_object_list(objects, src=0, group=group)
        out["send_recv_object_list"] = objects

    t = torch.tensor([float(rank)])
    if rank == 0:
        dist.send(torch.tensor([42.0]), dst=1, group=group)
    else:
        dist.recv(t, src=0, group=group)
    out["send_recv"] = t.item()

    t = torch.zeros(1)
    work = (
        dist.isend(torch.tensor([rank + 100.0]), dst=peer, group=group)
        if rank == 0
        else dist.irecv(t, src=peer, group=group)
    )
    work.wait()
    out["isend_irecv"] = t.item()

    recv = torch.zeros(1)
    ops = [
        dist.P2POp(dist.isend, torch.tensor([rank + 20.0]), peer, group),
        dist.P2POp(dist.irecv, recv, peer, group),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    out["batch_isend_irecv"] = recv.item()

    dist.barrier(group=group)
    dist.monitored_barrier(group=group)
    out["barriers"] = True

    first, second = torch.full((2,), float(rank)), torch.full((3,), rank + 1.0)
    gathered_t = torch.zeros(4)
    scattered = torch.zeros(2)
    with dist._coalescing_manager(group, async_ops=True) as manager:
        dist.all_reduce(first, group=group, async_op=True)
        dist.all_reduce(second, group=group, async_op=True)
    manager.wait()
    with dist._coalescing_manager(group, async_ops=True) as manager:
        dist.all_gather_into_tensor(gathered_t, torch.full((2,), float(rank)), group, True)
    manager.wait()
    with dist._coalescing_manager(group, async_ops=True) as manager:
        dist.reduce_scatter_tensor(scattered, torch.arange(4.0) + rank, group=group, async_op=True)
    manager.wait()
    out["coalesced"] = [first.tolist(), second.tolist(), gathered_t.tolist(), scattered.tolist()]

    out["queries"] = [
        dist.get_rank(group),
        dist.get_world_size(group),
        dist.get_process_group_ranks(group),
        dist.get_global_rank(group, 1),
        dist.get_group_rank(group, 0),
        str(dist.get_backend(group)),
        str(dist.get_backend_config(group)),
    ]
    return out


def expected(rank: int) -> dict[str, Any]:
    """What ``exercise`` returns on two ranks whose group is [0, 1]."""
    pair = [0.0, 0.0, 1.0, 1.0]
    return {
        "all_reduce": [3.0, 6.0],
        "broadcast": [1.0, 1.0],
        "all_gather": [[0.0, 0.0], [1.0, 1.0]],
        "all_gather_into_tensor": pair,
        "all_gather_single": pair,
        "_all_gather_base": pair,
        "reduce_scatter_tensor": [[1.0, 3.0], [5.0, 7.0]][rank],
        "reduce_scatter_single": [[1.0, 3.0], [5.0, 7.0]][rank],
        "_reduce_scatter_base": [[1.0, 3.0], [5.0, 7.0]][rank],
        "reduce_scatter": [[1.0, 1.0], [3.0, 3.0]][rank],
        "all_to_all_single": [[0.0, 10.0], [1.0, 11.0]][rank],
        "all_to_all": [[0.0, 1.0], [10.0, 11.0]][rank],
        "reduce": 3.0 if rank == 0 else None,
        "gather": [5.0, 6.0] if rank == 0 else None,
        "scatter": [7.0, 8.0][rank],
        "all_gather_object": [{"rank": 0}, {"rank": 1}],
        "broadcast_object_list": [{"from": 0}],
        "gather_object": ["obj0", "obj1"] if rank == 0 else None,
        "scatter_object_list": [["a", "b"][rank]],
        "send_recv_object_list": None if rank == 0 else [{"k": 1}],
        "send_recv": [0.0, 42.0][rank],
        "isend_irecv": [0.0, 100.0][rank],
        "batch_isend_irecv": [21.0, 20.0][rank],
        "barriers": True,
        "coalesced": [[1.0, 1.0], [3.0, 3.0, 3.0], pair, [[1.0, 3.0], [5.0, 7.0]][rank]],
        "queries": [rank, 2, [0, 1], 1, 0, "gloo", "cpu:gloo,cuda:gloo"],
    }
