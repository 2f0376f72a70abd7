"""A slime-shaped program for ``python -m reloadpg_autopatch demo --framework slime``.

``reloadable_process_group`` has the surface of slime's lifecycle module (its own
``monkey_patch_torch_dist``, a wrapper class whose ``.group`` becomes None on destroy, WORLD's
registration, ``destroy_process_groups``, ``reload_process_groups``) and ``actor`` the surface of
slime's Megatron actor, which binds those names at import. Neither imports this package: the
demo's ranks adopt the lifecycle module by naming it in ``SLIME_RELOADABLE_PG_ADOPT_MODULES``,
as a user's fork would be named. Their groups run on ``cpu_suspend``, the package's CPU model of
NCCL's suspend (``tools/cpu_nccl``) registered by the demo's rank harness (``demo_actor``), so
that the suspend mode has something to suspend on a laptop.
"""
