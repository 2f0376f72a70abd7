"""The lifecycle of reloadable groups: every group's state, names, WORLD, destroy and reload.

Nothing here imports ``patching/``: the patch calls into the lifecycle, never the reverse.
"""
