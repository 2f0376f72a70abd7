"""slime's accelerator facade, ``slime.utils.accelerator``, reduced to the backend choice.

Written for this project from the notes on slime's public source (PR #2216, MUSA support; none
of its code): ``process_group_backend("nccl")`` names the communication backend of the
accelerator slime runs on (``mccl`` on MUSA, ``nccl`` elsewhere), and ``is_accelerator_backend``
tells whether a WORLD backend holds accelerator memory. slime picks the accelerator from the
device it finds or from ``SLIME_ACCELERATOR``; CPU has no MUSA device, so the tests set that
variable and register a gloo-backed backend named ``mccl``.
"""

import os

#: The communication backend of each accelerator slime knows.
COMMUNICATION_BACKENDS = {"cuda": "nccl", "musa": "mccl"}


def device_type() -> str:
    chosen = os.environ.get("SLIME_ACCELERATOR", "").strip().lower()
    return chosen if chosen in COMMUNICATION_BACKENDS else "cuda"


def process_group_backend(default: str = "nccl") -> str:
    """The backend to create a group with where slime asks for ``default``."""
    return COMMUNICATION_BACKENDS[device_type()] if default == "nccl" else default


def is_accelerator_backend(backend: str) -> bool:
    normalized = str(backend).lower()
    return any(name in normalized for name in COMMUNICATION_BACKENDS.values())
