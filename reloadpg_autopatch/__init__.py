"""Reloadable torch.distributed process groups, patched in before Megatron binds them.

Importing this package is cheap and never imports torch: the public names below load their
module on first use (PEP 562), because start-up imports this package in every Python process of
an image where a variable of ours besides the gate is set, pip and Ray's own workers included.
"""

__version__ = "0.3.0"

_EXPORTS = {
    "monkey_patch_torch_dist": "adoption.landing",
    "is_patched": "patching.patchset",
    "patched_names": "patching.patchset",
    "rebind": "patching.sweep",
    "find_stale": "patching.sweep",
    "Rebinding": "patching.sweep",
    "unwrap": "groups.unwrap",
    "ReloadableProcessGroup": "groups.ways.wrapper",
    "destroy_process_groups": "groups.lifecycle",
    "reload_process_groups": "groups.lifecycle",
    "reloadable_groups": "groups.lifecycle",
    "register_default_process_group": "groups.lifecycle",
    "set_wrap_policy": "groups.policy",
    "get_wrap_policy": "groups.policy",
    "GroupSpec": "groups.policy",
    "set_reload_mode": "groups.mode",
    "get_reload_mode": "groups.mode",
    "add_reload_hook": "groups.hooks",
    "ReloadHookHandle": "groups.hooks",
    "last_cycle_report": "groups.lifecycle",
    "CycleReport": "groups.report",
    "StepReport": "groups.report",
    "set_memory_guard": "groups.guard",
    "get_memory_guard": "groups.guard",
    "set_memory_probe": "groups.memory",
    "MemoryFigures": "groups.memory",
    "MemoryGuard": "groups.settings",
    # The errors a program catches by type (``errors`` imports nothing, not even torch).
    "ReloadPGError": "errors",
    "PeerMissingError": "errors",
    "GroupDestroyedError": "errors",
    "GroupSuspendedError": "errors",
    "GroupBrokenError": "errors",
    "ReloadHookError": "errors",
    "ModeRefusedError": "errors",
    "RegistrationError": "errors",
    "ReleaseError": "errors",
    "StepInProgressError": "errors",
    "WorldLostError": "errors",
    "MemoryShortError": "errors",
}

__all__ = [
    "CycleReport",
    "GroupBrokenError",
    "GroupDestroyedError",
    "GroupSpec",
    "GroupSuspendedError",
    "MemoryFigures",
    "MemoryGuard",
    "MemoryShortError",
    "ModeRefusedError",
    "PeerMissingError",
    "Rebinding",
    "RegistrationError",
    "ReleaseError",
    "ReloadHookError",
    "ReloadHookHandle",
    "ReloadPGError",
    "ReloadableProcessGroup",
    "StepInProgressError",
    "StepReport",
    "WorldLostError",
    "__version__",
    "add_reload_hook",
    "destroy_process_groups",
    "find_stale",
    "get_memory_guard",
    "get_reload_mode",
    "get_wrap_policy",
    "is_patched",
    "last_cycle_report",
    "monkey_patch_torch_dist",
    "patched_names",
    "rebind",
    "register_default_process_group",
    "reload_process_groups",
    "reloadable_groups",
    "set_memory_guard",
    "set_memory_probe",
    "set_reload_mode",
    "set_wrap_policy",
    "unwrap",
]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'reloadpg_autopatch' has no attribute {name!r}")
    value = getattr(__import__(f"{__name__}.{module}", fromlist=[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)
