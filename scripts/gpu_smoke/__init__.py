"""The GPU smoke run of ``scripts/gpu_smoke.py``, one module per step (see that script).

Read from the top: ``cli`` (the command line, the preflight first, then each step), ``runner``
(a step's plan against the budget, its runs, what the script makes of them), ``sessions``
(a run's ranks, each in a process session of its own, stopped at its deadline), ``gpu`` (the
GPU checked free before each run), ``record`` (``smoke.json``), ``steps`` (the steps in order
and their rank programs), and ``plan`` (runs, deadlines, worst cases, what the preflight found).

One module per step, each with its plan and the programs its ranks run: ``preflight``,
``nccl_suspend``, ``wrapper_demo``, ``wrapper_checks`` (with ``concert`` and ``pool``),
``package_suspend``, ``native_nccl2``, ``suspend_probes``. What their ranks share: ``rank``
(a rank's arguments, its reports, its device), ``rank_cli`` (what ``gpu_smoke_ranks.py``
runs), ``nccl`` (NCCL's library and its suspend API, raw) and ``workload`` (collectives that
fill and check groups). ``common`` holds the names and limits of both sides.

Not the shipped package's: the script runs from the checkout, against the package installed
where site runs its ``.pth``; the rehearsal uses that package's CPU model of NCCL's suspend
(``reloadpg_autopatch.tools.cpu_nccl``).
"""
