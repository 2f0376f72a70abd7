"""Start-up of reloadpg_autopatch where the gate is on: the one module the ``.pth`` line imports.

Every Python process of an image reads the ``.pth`` file, so where ``SLIME_RELOADABLE_PG`` is
on, start-up imports this one top-level module (a module of the package would bring the
package, ``_env`` and ``_startup``: 0.1 to 0.3 ms each). With the gate on and no other variable
of ours set, it installs the import watchers and stops; anything to check or say goes through
``reloadpg_autopatch._startup``. The callbacks import the package only when they run.

The watchers are meta-path finders that run a callback right after a module finishes
executing. Each must cost nothing until that module is imported: ``find_spec`` returns after a
string comparison for every other name, and this file imports nothing beyond ``os`` and ``sys``
(which site has loaded) and the builtin ``_thread``. It finds the real spec by asking the other
finders on ``sys.meta_path`` directly (editable-install finders, the path finder with its
zipimport and namespace-package support all keep working), never through
``importlib.util.find_spec``, which would re-enter the import system. The loader is proxied
only for the duration of ``exec_module``; the module's ``__loader__`` and ``__spec__.loader``
are restored before the callback runs, outside our lock.

The patch is built from the package's own modules, so it cannot run while one of them is
half-imported: that happens when *our* module is the first to import torch. With
``defer_prefix`` the finder also watches the modules under that prefix and, if any of them is
still initializing when the target finishes, runs the callback as soon as the last one is done.
``watch`` installs a finder that stays: it calls back for every module under some prefixes as it
finishes importing (the frameworks' lifecycle modules, the ``SLIME_RELOADABLE_PG_REBIND`` sweep).
Locks are replaced in a forked child: a fork taken while another thread held one would otherwise
leave the child's imports waiting forever.
"""

import os
import sys
from _thread import allocate_lock, get_ident


class _LoaderProxy:
    """Delegates to the real loader and reports a successful ``exec_module`` to the finder."""

    def __init__(self, finder: "_Finder", loader: object, is_target: bool) -> None:
        self._finder = finder
        self._loader = loader
        self._is_target = is_target

    def create_module(self, spec: object) -> object:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: object) -> None:
        try:
            self._loader.exec_module(module)
        except BaseException:
            self._restore(module)
            if not self._is_target:
                # A module of ours that held the patch back failed: it no longer does.
                self._finder.executed(module, False)
            raise
        self._restore(module)
        self._finder.executed(module, self._is_target)

    def _restore(self, module: object) -> None:
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader

    def __getattr__(self, name: str) -> object:
        # get_source, get_filename, is_package, get_resource_reader... of the real loader.
        return getattr(self._loader, name)


def _proxied_spec(
    finder: object, fullname: str, path: object, target: object, flag: bool
) -> object:
    """The spec the other finders give ``fullname``, its loader proxied to report to ``finder``."""
    key = (get_ident(), fullname)
    with finder._lock:
        if key in finder._asking:
            return None  # we are the one asking: let the others answer
        finder._asking.add(key)
    try:
        spec = None
        for other in list(sys.meta_path):
            if other is finder:
                continue
            find = getattr(other, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
    finally:
        with finder._lock:
            finder._asking.discard(key)
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return spec
    spec.loader = _LoaderProxy(finder, spec.loader, flag)
    return spec


class _Finder:
    """Watches for one module name; removes itself once the callback has run."""

    def __init__(self, name: str, callback: object, defer_prefix: "str | None") -> None:
        self.name = name
        self.callback = callback
        self.defer_prefix = defer_prefix
        self._lock = allocate_lock()
        self._asking: set = set()  # (thread, name) pairs we are resolving ourselves
        self._target_done = False
        self._done = False

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        if fullname == self.name:
            is_target = True
        elif self.defer_prefix is not None and fullname.startswith(self.defer_prefix):
            is_target = False
        else:
            return None
        if self._done:
            return None
        return _proxied_spec(self, fullname, path, target, is_target)

    def _blocked(self, finished: object) -> bool:
        """Whether a module under ``defer_prefix`` other than ``finished`` is mid-import.

        Any thread's import counts. Building the patch in this thread while another thread
        holds one of our modules half-imported would meet that module's import lock held
        against us, and the import system resolves such a cycle with a half-initialized
        module. Waiting instead costs this thread a short unpatched window, which the sweep
        run by the patch (Megatron's bindings by default) closes when the other import ends.
        """
        prefix = self.defer_prefix
        if prefix is None:
            return False
        for name, module in list(sys.modules.items()):
            if module is finished or not name.startswith(prefix):
                continue
            if getattr(getattr(module, "__spec__", None), "_initializing", False):
                return True
        return False

    def executed(self, module: object, is_target: bool) -> None:
        with self._lock:
            if self._done:
                return
            if is_target:
                self._target_done = True
            if not self._target_done or self._blocked(module):
                return
            self._done = True
        uninstall(self)
        target = sys.modules.get(self.name, module if is_target else None)
        parent, _, child = self.name.rpartition(".")
        parent_module = sys.modules.get(parent) if parent else None
        if target is not None and parent_module is not None and not hasattr(parent_module, child):
            # The import system sets this only after exec_module returns; the callback may
            # already look the submodule up as an attribute of its package.
            setattr(parent_module, child, target)
        try:
            self.callback()
        except Exception as error:  # the import that triggered us must still succeed
            sys.stderr.write(f"reloadpg_autopatch: import hook failed: {error!r}\n")


class _Watcher:
    """Calls back with every module under some prefixes once it has executed; stays put."""

    def __init__(self, prefixes: tuple, callback: object) -> None:
        self.exact = frozenset(prefixes)
        self.dotted = tuple(p + "." for p in prefixes)
        self.callback = callback
        self._lock = allocate_lock()
        self._asking: set = set()

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        if fullname not in self.exact and not fullname.startswith(self.dotted):
            return None
        return _proxied_spec(self, fullname, path, target, True)

    def executed(self, module: object, succeeded: bool) -> None:
        if not succeeded:
            return
        try:
            self.callback(module)
        except Exception as error:  # the import that triggered us must still succeed
            sys.stderr.write(f"reloadpg_autopatch: import watcher failed: {error!r}\n")


def watch(prefixes: tuple, callback: object) -> "_Watcher":
    """Call ``callback(module)`` after each module ``p`` or ``p.*``, ``p`` in ``prefixes``."""
    watcher = _Watcher(tuple(prefixes), callback)
    sys.meta_path.insert(0, watcher)
    return watcher


def install(name: str, callback: object, defer_prefix: "str | None" = None) -> "_Finder":
    """Run ``callback()`` once, right after module ``name`` has executed.

    With ``defer_prefix``, wait until no module whose name starts with it is mid-import.
    """
    for finder in sys.meta_path:
        if isinstance(finder, _Finder) and finder.name == name and not finder._done:
            return finder
    finder = _Finder(name, callback, defer_prefix)
    sys.meta_path.insert(0, finder)
    return finder


def uninstall(finder: "_Finder") -> None:
    """Remove ``finder`` from ``sys.meta_path`` if it is still there."""
    try:  # noqa: SIM105 - contextlib is not loaded at start-up
        sys.meta_path.remove(finder)
    except ValueError:
        pass


def installed() -> list:
    """The finders of this module currently on ``sys.meta_path``."""
    return [f for f in sys.meta_path if isinstance(f, (_Finder, _Watcher))]


def _new_locks_in_child() -> None:
    for finder in installed():
        finder._lock = allocate_lock()
        finder._asking = set()


os.register_at_fork(after_in_child=_new_locks_in_child)


# ---- start-up ---------------------------------------------------------------------------------

#: What start-up needs of ``reloadpg_autopatch._env`` (its values; ``tests/unit/test_boot.py``
#: keeps them equal), written here so that start-up imports no module of the package.
GATE = "SLIME_RELOADABLE_PG"
ON_VALUES = ("1", "true", "yes", "on")
ADOPT_MODULES = tuple(
    f"{name}.utils.reloadable_process_group" for name in ("slime", "miles", "vime")
)
PACKAGE = "reloadpg_autopatch"

#: Whether and by what this process was activated (``_startup.status`` reports it).
STATE = {"activated": False, "source": None}


def _patch() -> None:
    from reloadpg_autopatch._startup import patch_now

    patch_now()


def _adopt(module: object) -> None:
    from reloadpg_autopatch._startup import adopt_on_import

    adopt_on_import(module)


def activate(source: str, adopt_modules: tuple = ADOPT_MODULES) -> bool:
    """Patch ``torch.distributed`` as soon as it is imported (at once if it already is); hand
    each framework lifecycle module in ``adopt_modules`` to the adoption as it executes.

    Idempotent (a ``.pth`` can be processed twice in a venv; the ``.start`` entry point and an
    explicit call may both run): returns False where the process was activated already.
    """
    if STATE["activated"]:
        return False
    STATE["activated"] = True
    STATE["source"] = source
    watch(adopt_modules, _adopt)
    module = sys.modules.get("torch.distributed")
    if module is not None and getattr(module, "__spec__", None) is not None:
        _patch()
    else:
        install("torch.distributed", _patch, defer_prefix=PACKAGE + ".")
    return True


def _needs_checks(value: str) -> bool:
    """Whether start-up has something to say: a gate value other than on, or another variable
    of ours set (its value is checked, and may change what is watched)."""
    if value.strip().lower() not in ON_VALUES:
        return True
    prefix = GATE + "_"
    return any(key.startswith(prefix) and os.environ[key] for key in os.environ)


def activate_from_site() -> None:
    """Entry point of the ``.pth`` line and of the ``.start`` file: gate, then activate."""
    try:
        value = os.environ.get(GATE)
        if value is None:
            return
        if not _needs_checks(value):
            activate("site")
            return
        from reloadpg_autopatch._startup import activate_from_site as checked

        checked()
    except BaseException as error:  # the host process must always start
        message = f"activation failed: {type(error).__name__}: {error}"
        sys.stderr.write(f"reloadpg_autopatch: {message}\n")
