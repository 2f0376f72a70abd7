"""The wrapper's forwarders: every method and property of the installed torch's ProcessGroup.

Discovered from the installed torch, not listed: code that reaches torch with the wrapper itself
(a binding made before the patch) goes through the ``PyProcessGroup`` trampoline, which calls
whatever Python method has the name torch uses today (torch 2.13 renamed the collectives to
``all_gather_single`` and friends). A forwarder calls the base method on the native group held
in the wrapper's fast slot; an empty slot takes the wrapper's slow path (``_live``).
Registrations of hooks are kept on the record and replayed on each new native group.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch.distributed as dist

_NativeProcessGroup = dist.ProcessGroup

# pybind11 plumbing stays the base class's own. Static methods (``unbox``) and class data (the
# backend-type enum and its values) are left alone by the type checks in ``install``.
_NOT_FORWARDED = frozenset({"_pybind11_conduit_v1_"})


#: pybind's docstring of a method that takes ``self`` alone: ``name(self: ...) -> ...``. One
#: pattern for every name: a pattern per name costs a compile each (about 0.3 ms), at the
#: moment ``torch.distributed`` is imported.
_ONLY_SELF = re.compile(r"(\w+)\(self: [\w.]+\) -> .*")


def _takes_only_self(name: str, base: Any) -> bool:
    """Whether pybind's docstring gives one signature, ``name(self: ...) -> ...``."""
    first = (getattr(base, "__doc__", None) or "").split("\n", 1)[0]
    match = _ONLY_SELF.fullmatch(first)
    return match is not None and match[1] == name


def communicates(name: str, base: Any) -> bool:
    """Whether a ``ProcessGroup`` method talks to the peers: one of pybind's signatures for it
    returns a ``Work`` (every collective, p2p op and barrier), or it waits for the peers
    itself (``monitored_barrier``), or it makes a group or a window from this one."""
    signatures = (getattr(base, "__doc__", None) or "").splitlines()
    if any(
        "->" in line and line.rpartition("->")[2].strip().endswith("Work") for line in signatures
    ):
        return True
    return name in ("monitored_barrier", "split_group", "merge_remote_group", "new_window")


def _forward_method(name: str, base: Any) -> Any:
    # The unbound base method, called on the native group: no bound method is made per call.
    # torch calls these on every collective that reaches a group through the default group
    # (WORLD's stand-in) or by name, so ``rank()`` and ``size()`` get a fixed-arity forwarder.
    local = not communicates(name, base)
    if _takes_only_self(name, base):

        def method(self: Any) -> Any:
            inner = self._fast
            if inner is None:
                inner = self._live(f"{name}()", local)
            return base(inner)

    else:

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            inner = self._fast
            if inner is None:
                inner = self._live(f"{name}()", local)
            return base(inner, *args, **kwargs)

    method.__name__ = name
    method.__qualname__ = f"ReloadableProcessGroup.{name}"
    method.__doc__ = getattr(base, "__doc__", None)
    return method


def _recording_method(name: str, base: Any, unregisters: str | None) -> Any:
    """A forwarder for a hook (un)registration, which the record keeps to replay on reload."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        inner = self.group
        if inner is None:
            raise self.destroyed_error(f"{name}()")
        result = getattr(inner, name)(*args, **kwargs)
        replays = self._record.replays
        if unregisters is None:
            replays.append((name, args, kwargs))
        else:  # unregister_X_hook(hook_id): forget the registrations under that id
            hook_id = _hook_id(args, kwargs)
            replays[:] = [
                h for h in replays if not (h[0] == unregisters and _hook_id(*h[1:]) == hook_id)
            ]
        return result

    method.__name__ = name
    method.__qualname__ = f"ReloadableProcessGroup.{name}"
    method.__doc__ = getattr(base, "__doc__", None)
    return method


def _hook_id(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The id a hook was registered under, or is unregistered by: the first argument."""
    return args[0] if args else kwargs.get("hook_id")


# Hooks live on the native group and die with it; these registrations are replayed on each new
# one. torch 2.14 has register_/unregister_{pre,post,abort}_hook, and every version has
# _register_on_completion_hook.
_HOOK_REGISTRATION = re.compile(r"^_?(un)?register_(\w+)_hook$")


def _forward_property(name: str, base: property) -> property:
    def fget(self: Any) -> Any:
        inner = self._kept()
        if inner is None:
            raise self.destroyed_error(f"property {name!r}")
        return getattr(inner, name)

    fset = None
    if base.fset is not None:

        def fset(self: Any, value: Any) -> None:
            inner = self.group
            if inner is None:
                raise self.destroyed_error(f"setting {name!r}")
            setattr(inner, name, value)

    return property(fget, fset, doc=base.__doc__)


def install(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Give ``cls`` a forwarder for every member of ``ProcessGroup``; return their names."""
    methods, properties = [], []
    for name in dir(_NativeProcessGroup):
        if name.startswith("__") or name in _NOT_FORWARDED:
            continue
        raw = inspect.getattr_static(_NativeProcessGroup, name)
        if name in cls.__dict__:  # forwarded by a hand-written member (group_name)
            (properties if isinstance(raw, property) else methods).append(name)
            continue
        if isinstance(raw, property):
            setattr(cls, name, _forward_property(name, raw))
            properties.append(name)
        elif isinstance(raw, (staticmethod, classmethod, type)) or not callable(raw):
            continue  # class-level data and helpers behave the same on the subclass
        else:
            match = _HOOK_REGISTRATION.match(name)
            if match is None:
                setattr(cls, name, _forward_method(name, raw))
            else:
                unregisters = name.replace("unregister_", "register_") if match[1] else None
                setattr(cls, name, _recording_method(name, raw, unregisters))
            methods.append(name)
    return tuple(methods), tuple(properties)
