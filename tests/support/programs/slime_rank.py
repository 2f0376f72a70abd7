"""One rank of a slime-shaped job, in a fresh interpreter whose environment is its own.

Run as ``python slime_rank.py RANK WORLD_SIZE PORT WORLD_TIMEOUT_S`` with the repository on
``PYTHONPATH``: WORLD is joined through ``env://`` (rank 0 hosts the store, as under Ray), and
the slime-shaped actor of ``tests/support/frameworks`` runs its ``init`` (its Gloo group, WORLD's
registration, Megatron's groups, a first sleep). Prints one JSON line: whether the package
patched this interpreter, and the error ``init`` raised (class, text, ``missing``) with how long
it took. Nothing here calls the package: the gate (or its absence) is the only switch.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from types import SimpleNamespace


def main() -> None:
    warnings.simplefilter("ignore")
    rank, size, port, timeout_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=rank, WORLD_SIZE=size)
    from tests.support import frameworks

    frameworks.on_path()
    from slime.backends.megatron_utils import actor as actor_module

    args = SimpleNamespace(
        distributed_backend="gloo", distributed_timeout_minutes=timeout_s / 60, offload_train=True
    )
    started = time.monotonic()
    out: dict[str, object] = {"error": None, "message": "", "missing": None}
    try:
        actor_module.MegatronTrainRayActor().init(args)
    except Exception as error:
        out = {
            "error": type(error).__name__,
            "message": str(error),
            "missing": getattr(error, "missing", None),
        }
    out["seconds"] = time.monotonic() - started
    import reloadpg_autopatch

    out["patched"] = reloadpg_autopatch.is_patched()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
