"""Variant B, ``"suspendable_py"`` (torch 2.14 only): a pure-Python ``Backend``.

A ``torch._C._distributed_c10d.Backend`` subclass (:func:`python_backend_available`: 2.13
cannot construct one from Python). Collectives dispatched from C++ reach Python; it records each
in ``ledger.CALLS`` and delegates to a gloo backend it owns. A collective while suspended is
refused the way a suspended NCCL comm would fail, with a sticky ``DistBackendError`` ("CUDA
error: an illegal memory access ...").
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend

from .accelerator import flat, hosts
from .protocol import SuspendProtocol

NAME_B = "suspendable_py"


class SuspendablePy(SuspendProtocol, _C10dBackend):
    """Variant B: every collective torch dispatches reaches Python; gloo does the work."""

    def __init__(
        self,
        store: Any,
        rank: int,
        size: int,
        timeout: timedelta,
        *,
        name: str = NAME_B,
        defaults: dict[str, Any] | None = None,
    ) -> None:
        _C10dBackend.__init__(self, rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._protocol_init(name, rank, size, defaults)

    def _gloo_backend(self) -> Any:
        return self._gloo

    # torch 2.14.1 asserts without it ("getBackendName is not implemented").
    def getBackendName(self) -> str:
        return NAME_B

    # Without these, torch 2.14.1's trampoline finds the base class's property, calls it, and
    # the property calls the trampoline again: RecursionError (batch_isend_irecv reads
    # supports_coalescing).
    supports_coalescing = property(lambda self: False)
    supports_splitting = property(lambda self: False)
    supports_time_estimate = property(lambda self: False)
    supports_shrinking = property(lambda self: False)
    supports_reconfigure = property(lambda self: False)
    supports_window = property(lambda self: False)
    options = property(lambda self: self._gloo.options)

    def shutdown(self) -> None:
        self._record("shutdown", "ok")
        self._gloo.shutdown()

    def set_timeout(self, timeout: timedelta) -> None:
        self._gloo.set_timeout(timeout)

    # TORCH_DISTRIBUTED_DEBUG=DETAIL's _ProcessGroupWrapper reads these on every collective
    # ("Backend suspendable_py does not yet support sequence numbers" without them).
    def _set_sequence_number_for_group(self) -> None:
        self._sequence = 0

    def _get_sequence_number_for_group(self) -> int:
        return self._sequence

    def _run(self, op: str, method: str, *args: Any) -> Any:
        self._enter(op, flat(*args))
        target = getattr(self._gloo, method)
        return target(*hosts(list(args)))

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        return self._run("allreduce", "allreduce", tensors, *_opt(opts, dist.AllreduceOptions))

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        return self._run("allreduce_coalesced", "allreduce_coalesced", tensors, opts)

    def broadcast(self, tensors: Any, opts: Any = None) -> Any:
        return self._run("broadcast", "broadcast", tensors, *_opt(opts, dist.BroadcastOptions))

    def reduce(self, tensors: Any, opts: Any = None) -> Any:
        return self._run("reduce", "reduce", tensors, *_opt(opts, dist.ReduceOptions))

    def allgather(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self._run("allgather", "allgather", outputs, inputs, *_opt(opts, _AllgatherOptions))

    def all_gather_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        method = _gloo_name("all_gather_single", "_allgather_base")
        return self._run("all_gather_single", method, output, input, *_opt(opts, _AllgatherOptions))

    _allgather_base = all_gather_single

    def allgather_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        extra = _opt(opts, _AllgatherOptions)
        return self._run("allgather_coalesced", "allgather_coalesced", outputs, inputs, *extra)

    def all_gather_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        method = _gloo_name("all_gather_single_coalesced", "allgather_into_tensor_coalesced")
        extra = _opt(opts, _AllgatherOptions)
        return self._run("all_gather_single_coalesced", method, outputs, inputs, *extra)

    def gather(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self._run("gather", "gather", outputs, inputs, *_opt(opts, dist.GatherOptions))

    def scatter(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self._run("scatter", "scatter", outputs, inputs, *_opt(opts, dist.ScatterOptions))

    def reduce_scatter(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        extra = _opt(opts, dist.ReduceScatterOptions)
        return self._run("reduce_scatter", "reduce_scatter", outputs, inputs, *extra)

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        method = _gloo_name("reduce_scatter_single", "_reduce_scatter_base")
        extra = _opt(opts, dist.ReduceScatterOptions)
        return self._run("reduce_scatter_single", method, output, input, *extra)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        method = _gloo_name("reduce_scatter_single_coalesced", "reduce_scatter_tensor_coalesced")
        extra = _opt(opts, dist.ReduceScatterOptions)
        return self._run("reduce_scatter_single_coalesced", method, outputs, inputs, *extra)

    def all_to_all_single(
        self,
        output: Any,
        input: Any,
        output_splits: Any,
        input_splits: Any,
        opts: Any = None,
    ) -> Any:
        method = _gloo_name("all_to_all_single", "alltoall_base")
        extra = _opt(opts, dist.AllToAllOptions)
        return self._run(
            "all_to_all_single", method, output, input, output_splits, input_splits, *extra
        )

    alltoall_base = all_to_all_single

    def alltoall(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self._run("alltoall", "alltoall", outputs, inputs, *_opt(opts, dist.AllToAllOptions))

    def send(self, tensors: Any, dst: int, tag: int = 0) -> Any:
        return self._run("send", "send", tensors, dst, tag)

    def recv(self, tensors: Any, src: int, tag: int = 0) -> Any:
        return self._run("recv", "recv", tensors, src, tag)

    def recv_anysource(self, tensors: Any, tag: int = 0) -> Any:
        return self._run("recv_anysource", "recv_anysource", tensors, tag)

    def barrier(self, opts: Any = None) -> Any:
        return self._run("barrier", "barrier", *_opt(opts, dist.BarrierOptions))

    def monitored_barrier(self, opts: Any = None, wait_all_ranks: bool = False) -> None:
        # torch hands over BarrierOptions; gloo's binding takes the timeout.
        self._enter("monitored_barrier")
        timeout = opts.timeout if opts is not None else timedelta(seconds=1800)
        self._gloo.monitored_barrier(timeout, wait_all_ranks)


def _opt(opts: Any, kind: Any) -> tuple[Any, ...]:
    return (opts if opts is not None else kind(),)


def _gloo_name(new: str, old: str) -> str:
    return new if hasattr(dist.ProcessGroupGloo, new) else old


_AllgatherOptions = torch._C._distributed_c10d.AllgatherOptions


@functools.cache
def python_backend_available() -> bool:
    """Whether this torch lets Python construct a ``Backend`` (2.14: yes; 2.13: no)."""
    try:
        _C10dBackend(0, 1)
    except TypeError:  # "No constructor defined!"
        return False
    return True


PYTHON_BACKEND_REASON = (
    "variant B needs a Python-constructible torch._C._distributed_c10d.Backend (torch 2.14); "
    f"torch {torch.__version__} says 'No constructor defined!'"
)
