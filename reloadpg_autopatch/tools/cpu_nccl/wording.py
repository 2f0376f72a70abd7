"""NCCL's errors as torch raises them, so that what the package matches on is what a GPU says.

NCCL errors mimic torch's ``C10D_NCCL_CHECK`` text; the "not initialized", "does not support"
and "requires NCCL 2.29.7 or later" errors are plain ``RuntimeError``s, as torch's
``TORCH_CHECK`` raises them (``docs/suspend-facts.md``, "The stand-in's model choices").
"""

from __future__ import annotations

import torch.distributed as dist

NCCL_VERSION = "2.30.7"
UNINITIALIZED_CLASSIC = "NCCL communicator not initialized."
UNINITIALIZED_NCCL2 = "ProcessGroupNCCL not initialized"
ALREADY_SUSPENDED = "Already suspended"
NOT_SUSPENDED = "Not in suspended state"
SPLIT_SHARE = "Memory suspend not supported with split_share communicators"
ILLEGAL_ADDRESS = "CUDA error: an illegal memory access was encountered"

_HEADS = {
    "invalid usage": (
        "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
        "WARN",
    ),
    "unhandled cuda error": (
        "ncclUnhandledCudaError: Call to CUDA function failed.",
        "INFO",
    ),
    "unhandled system error": (
        "ncclSystemError: System call (e.g. socket, malloc) or external library call "
        "failed or device error.",
        "INFO",
    ),
    "internal error": ("ncclInternalError: Internal check failed.", "INFO"),
    "remote process exited or there was a network error": (
        "ncclRemoteError: A call failed possibly due to a network error or a remote "
        "process exiting prematurely.",
        "INFO",
    ),
}


def nccl_error(kind: str, detail: str) -> dist.DistBackendError:
    """A ``DistBackendError`` worded like torch's ``C10D_NCCL_CHECK`` for an NCCL result."""
    head, level = _HEADS[kind]
    return dist.DistBackendError(
        f"NCCL error in: suspendable (stand-in for NCCLUtils.cpp), {kind} (run with "
        f"NCCL_DEBUG={level} for details), NCCL version {NCCL_VERSION}\n{head}\n"
        f"Last error:\n{detail}"
    )


def first_line(error: BaseException) -> str:
    """How the call log records a call that raised: its type and first line."""
    text = str(error).strip().splitlines()
    return f"raised: {type(error).__name__}: {text[0] if text else ''}"
