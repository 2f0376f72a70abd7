"""A meta-path finder that runs a callback right after one module finishes executing.

Installed at start-up, it must cost nothing until that module is imported: its ``find_spec``
returns at the first string comparison for every other name, and this file imports nothing
beyond the builtin ``_thread``. It finds the real spec by asking the other finders on
``sys.meta_path`` directly (editable-install finders, the path finder with its zipimport and
namespace-package support all keep working), never through ``importlib.util.find_spec``, which
would re-enter the import system. The loader is proxied only for the duration of
``exec_module``; the module's ``__loader__`` and ``__spec__.loader`` are restored before the
callback runs, outside our lock.
"""

import sys
from _thread import allocate_lock


class _LoaderProxy:
    """Delegates to the real loader and fires the hook after a successful ``exec_module``."""

    def __init__(self, finder: "_Finder", loader: object) -> None:
        self._finder = finder
        self._loader = loader

    def create_module(self, spec: object) -> object:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: object) -> None:
        try:
            self._loader.exec_module(module)
        finally:
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._loader
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._loader
        self._finder.fired(module)

    def __getattr__(self, name: str) -> object:
        # get_source, get_filename, is_package, get_resource_reader... of the real loader.
        return getattr(self._loader, name)


class _Finder:
    """Watches for one module name; removes itself once the callback has run."""

    def __init__(self, name: str, callback: object) -> None:
        self.name = name
        self.callback = callback
        self._lock = allocate_lock()
        self._done = False
        self._busy = False

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        if fullname != self.name:
            return None
        with self._lock:
            if self._done or self._busy:
                return None  # fired already, or we are asking the other finders ourselves
            self._busy = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            with self._lock:
                self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _LoaderProxy(self, spec.loader)
        return spec

    def fired(self, module: object) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        uninstall(self)
        parent, _, child = self.name.rpartition(".")
        parent_module = sys.modules.get(parent) if parent else None
        if parent_module is not None and not hasattr(parent_module, child):
            # The import system sets this only after exec_module returns; the callback may
            # already look the submodule up as an attribute of its package.
            setattr(parent_module, child, module)
        try:
            self.callback()
        except Exception as error:  # the import that triggered us must still succeed
            sys.stderr.write(f"reloadpg_autopatch: import hook failed: {error!r}\n")


def install(name: str, callback: object) -> "_Finder":
    """Run ``callback()`` once, right after module ``name`` has executed."""
    for finder in sys.meta_path:
        if isinstance(finder, _Finder) and finder.name == name and not finder._done:
            return finder
    finder = _Finder(name, callback)
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
    return [f for f in sys.meta_path if isinstance(f, _Finder)]
