"""GPU smoke run: every NCCL path of the package on one GPU, with data from the first run.

    python scripts/gpu_smoke.py --out DIR [--budget SECONDS] [--steps NAME,...] [--rehearse]
    python scripts/gpu_smoke.py --plan        # the worst-case time table, as JSON

Not part of the tests. An accelerator machine is lent by chance, for minutes, with whatever
torch its image holds (torch 2.11 with NCCL 2.28.9, last read), so this script is built to give
data on its first run there:

- A preflight (one fresh rank started with ``SLIME_RELOADABLE_PG=1`` alone) records torch,
  CUDA, the driver, NCCL as built and as loaded (``ncclGetVersion`` of the libnccl in the
  process), which implementation a plain ``nccl`` group gets, whether ``Backend.suspend``
  exists, whether nccl2 can be registered (torch 2.14 registers it from an entry point), and
  whether the package's ``.pth`` activated it. Each later step runs only where its needs are
  met, and records why not otherwise.
- Steps, by value: NCCL's own suspend and resume on torch's communicators (torch's API, or
  NCCL's C API through ctypes where torch is older than its NCCL), the demo's cycle in the
  wrapper mode on ``nccl``, the wrapper mode's checks (WORLD swapped and back, the memory
  guard, a CUDA memory pool across a reload, the cycle report against ``mem_get_info``), the
  package's suspend mode and in place, each on ``nccl`` and on ``nccl-legacy`` (each run
  records which implementation it got: torch 2.15's ``nccl`` is nccl2; on torch 2.14 the
  ``nccl`` pass sets ``TORCH_DIST_USE_NCCL2=1`` so that the two passes cover nccl2 and the
  classic backend there too), and the suspend probes (a raw collective on a suspended
  communicator last: it may fault the GPU).
- ``DIR/smoke.json`` is written as each step and each run starts and ends, and twice a second
  while ranks report (a temporary file, then a rename), so a run cut at its limit still
  returns its data, the running step's included. Every rank is a fresh
  interpreter in a process session of its own, killed as a group at its deadline (and by the
  kernel if this script dies); the GPU is checked free before each run. The deadlines add up
  to at most 8 minutes (``--plan``); ``--budget`` stops starting steps that might not fit.
- The steps live in the package ``gpu_smoke/`` beside this file, one module per step (its
  plan and its rank programs), with the runner (``cli``, ``runner``, ``sessions``, ``record``);
  each rank runs ``gpu_smoke_ranks.py``, which starts the program its run names.
- ``--rehearse`` runs the same steps on CPU, with gloo and the package's CPU model of NCCL's
  suspend (``reloadpg_autopatch.tools.cpu_nccl``) in NCCL's place, under the same deadlines and
  into the same JSON schema: CI runs it so that this script cannot rot between GPU draws.

Exit status: 0 every check held, 1 a check failed (``failures`` says which), 2 no CUDA device
(without ``--rehearse``; the JSON is still written), 130 interrupted.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder is already first on sys.path; loaded by its path, it is not.
HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from gpu_smoke.cli import main  # noqa: E402
from gpu_smoke.plan import Facts, passes  # noqa: E402

#: The script's own names for what plans a step's passes (tests/ranks/test_gpu_rehearsal.py
#: plans from a made-up preflight through them, no rank started).
_passes = passes
__all__ = ["Facts", "main"]

if __name__ == "__main__":
    sys.exit(main())
