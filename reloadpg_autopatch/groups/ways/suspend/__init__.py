"""Suspend in place (torch 2.12+, NCCL 2.29.7+): the way (``way``; ``wrapped`` on torch 2.13),
what a backend can do (``capability``), the guard while asleep (``guard``) and the watchdog
(``watchdog``)."""

from ...watchdog import suspend_timeout
from .awake import leave_awake
from .capability import (
    Capability,
    capability,
    environment_refusal,
    options_refusal,
    suspend_refusal,
    torch_can_suspend,
    torch_has_pre_hooks,
    version_refusal,
)
from .guard import HOOK_ID, Sleep, guard_error
from .way import SUSPEND, Suspend
from .wrapped import SUSPEND_WRAPPED, SuspendWrapped

__all__ = [
    "HOOK_ID",
    "SUSPEND",
    "SUSPEND_WRAPPED",
    "Capability",
    "Sleep",
    "Suspend",
    "SuspendWrapped",
    "capability",
    "environment_refusal",
    "guard_error",
    "leave_awake",
    "options_refusal",
    "suspend_refusal",
    "suspend_timeout",
    "torch_can_suspend",
    "torch_has_pre_hooks",
    "version_refusal",
]
