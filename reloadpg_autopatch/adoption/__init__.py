"""Adoption: a framework's lifecycle module, once imported, calls this package's lifecycle.

slime's, miles' and vime's actors bind their lifecycle at import (``from
slime.utils.reloadable_process_group import destroy_process_groups, ...``), exactly as Megatron
binds collectives. When such a module has executed (the start-up watcher calls
``handling.on_import`` before anything can import a name from it), or when the patch finds it
already imported (``landing.adopt_loaded``, which also points the names other modules bound at
ours), its lifecycle names are pointed at this package's own (``adopted``). With adoption off,
the framework's lifecycle stays, and its patch is put behind a guard (``guard``).

No patch: a layer of its own, between the start-up layer, which hands it the modules, and the
patching layer, whose guard generation and ``new_group`` it uses, above the lifecycle
(``groups``) it points the frameworks at. Nothing imports it when no framework module is loaded.
Each module does one job:

- ``switch``: ``SLIME_RELOADABLE_PG_ADOPT`` and the modules watched;
- ``adopted``: the lifecycle a framework's names are pointed at;
- ``jobs``: what the framework's patch does besides its lifecycle, kept when adopted;
- ``guard``: the guard over a framework's own patch, when its lifecycle stays;
- ``handling``: one module handed over, adopted or kept, once per module object;
- ``landing``: when the patch lands, the modules imported before it; the public
  ``monkey_patch_torch_dist`` (the patch, then those modules);
- ``seen``: what became of each module, and the doctor's ``status()``.

This ``__init__`` imports nothing, so that loading one of them loads no other.
"""
