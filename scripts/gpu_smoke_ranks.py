"""What each rank of ``scripts/gpu_smoke.py`` runs, in a fresh interpreter (not an entry point).

The script starts it with ``--rank-program NAME`` and the run's arguments; the programs are
the steps' own, in ``gpu_smoke/`` beside this file (``gpu_smoke/rank_cli.py`` reads the
arguments). Nothing here imports torch before a program starts.
"""

from __future__ import annotations

import sys

from gpu_smoke.rank_cli import rank_main

if __name__ == "__main__":
    sys.exit(rank_main(sys.argv[1:]))
