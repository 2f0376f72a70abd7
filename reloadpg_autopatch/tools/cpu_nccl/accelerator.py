"""A pretend accelerator: CPU tensors that torch routes to a group's accelerator leg.

Mixed groups (a CPU leg and a pretend accelerator leg, e.g.
``"cpu:gloo,privateuseone:suspendable"``): :func:`accelerator_tensor` wraps a CPU tensor in a
tensor subclass whose ``device`` is ``privateuseone:0`` (:data:`ACCELERATOR`), so that torch
routes its collectives to the group's backend for that device type. On torch 2.14 with
variant B as that backend (``"cpu:gloo,privateuseone:suspendable_py"``) the call goes through
torch's own dispatcher kernel (pre-hooks fire and see the accelerator tensors) and reaches
``SuspendablePy``. With variant A (both lanes; the only choice on 2.13) the tensor's
``__torch_dispatch__`` records and refuses the call itself and runs it on the backend's gloo;
torch 2.14's pre-hooks then never see it. A barrier on a mixed group goes to the CPU leg.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_map

from .gloo_subclass import SuspendableGloo

#: The pretend accelerator's device type (``SUSPENDABLE_ACCELERATOR``). ``privateuseone``
#: needs no CUDA anywhere; with ``cuda``, torch's Python calls ``torch.cuda`` for some ops
#: (``dist.broadcast`` asks ``torch.cuda.get_device_capability``), which fails without a GPU.
ACCELERATOR = os.environ.get("SUSPENDABLE_ACCELERATOR", "privateuseone")


class AcceleratorTensor(torch.Tensor):
    """A CPU tensor that says it lives on an accelerator (``privateuseone:0`` by default).

    Only ``device`` is pretend: the data is ``.host``, a CPU tensor, and ordinary ops run on
    it. Its collectives go to the group's backend for that device type (see the module
    docstring). Functional collectives (``_c10d_functional``) are not supported.
    """

    host: torch.Tensor

    @staticmethod
    def __new__(cls, host: torch.Tensor, device: torch.device) -> AcceleratorTensor:
        made = torch.Tensor._make_wrapper_subclass(
            cls,
            host.shape,
            dtype=host.dtype,
            device=device,
            strides=host.stride(),
            requires_grad=False,
        )
        made.host = host
        return made

    def __repr__(self) -> str:  # type: ignore[override]
        return f"AcceleratorTensor({self.host!r}, device={self.device})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "namespace", "") == "c10d":
            return _accelerator_collective(func, args, kwargs)
        device = next(t.device for t in flat(*args, *kwargs.values()) if isinstance(t, cls))
        if "device" in kwargs:
            kwargs = {**kwargs, "device": torch.device("cpu")}
        result = func(*hosts(list(args)), **hosts(kwargs))
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        if name.endswith("_") and args and isinstance(args[0], cls):
            return args[0]  # in place: the wrapper already shows the host's new values
        if name in ("_to_copy", "to", "_local_scalar_dense"):
            return result  # leaving the pretend device: plain CPU tensors
        return tree_map(lambda x: cls(x, device) if isinstance(x, torch.Tensor) else x, result)


def accelerator_tensor(host: torch.Tensor, device: str | torch.device | None = None) -> Any:
    """Wrap a CPU tensor so that torch sees it on ``device`` (default :data:`ACCELERATOR`,
    index 0 unless given)."""
    device = torch.device(device if device is not None else ACCELERATOR)
    if device.index is None:
        device = torch.device(device.type, 0)
    return AcceleratorTensor(host, device)


def _accelerator_collective(func: Any, args: Any, kwargs: Any) -> Any:
    boxed = next(a for a in flat(*args) if type(a).__name__ == "ScriptObject")
    pg = dist.ProcessGroup.unbox(boxed)
    tensors = [t for t in flat(*args) if isinstance(t, AcceleratorTensor)]
    device = tensors[0].device
    backend = pg._get_backend(device)
    python_key = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)
    if isinstance(backend, SuspendableGloo):
        # torch would hand these to C++ gloo, which cannot take a CUDA tensor: run the op on
        # this backend's own shadow group with the host tensors instead.
        backend._enter(func.overloadpacket.__name__, tensors)
        shadow = backend._shadow.boxed()

        def swap(x: Any) -> Any:
            if x is boxed:
                return shadow
            return x.host if isinstance(x, AcceleratorTensor) else x

        return func(*tree_map(swap, list(args)), **tree_map(swap, kwargs))
    # Variant B (or anything else): torch's own kernel for that device, pre-hooks and all.
    with torch._C._ExcludeDispatchKeyGuard(python_key):
        return func(*args, **kwargs)


def hosts(value: Any) -> Any:
    """Replace accelerator_tensor wrappers by the CPU tensors they hold, in nested lists."""
    return tree_map(lambda x: x.host if isinstance(x, AcceleratorTensor) else x, value)


def flat(*values: Any) -> Iterator[Any]:
    """Every item of nested lists and tuples, in order."""
    for value in values:
        if isinstance(value, (list, tuple)):
            yield from flat(*value)
        else:
            yield value
