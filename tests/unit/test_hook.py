"""The import hook on synthetic modules: plain, namespace, zipped, failing, concurrent."""

from __future__ import annotations

import importlib.machinery
import sys
import threading
import zipfile

import pytest

import _reloadpg_autopatch_boot as _hook

pytestmark = [pytest.mark.startup, pytest.mark.timeout(60)]


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A sys.path entry holding a regular package, a namespace package and a zip."""
    pkg = tmp_path / "hookprobe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "target.py").write_text("import sys\nVALUE = 41\nSEEN_LOADER = __loader__\n")
    (pkg / "broken.py").write_text("raise ImportError('broken on purpose')\n")
    # A watched module whose import pulls in the target half-way through, like our own
    # groups/ways/wrapper/group.py pulling in torch.distributed.
    (pkg / "outer.py").write_text("from hookprobe_pkg import inner\nDONE = True\n")
    (pkg / "inner.py").write_text("import hookprobe_pkg.target\nDONE = True\n")
    (pkg / "failing_outer.py").write_text("import hookprobe_pkg.target\nraise ValueError('late')\n")
    ns = tmp_path / "hookprobe_ns"
    ns.mkdir()
    (ns / "leaf.py").write_text("VALUE = 'ns'\n")
    with zipfile.ZipFile(tmp_path / "zipped.zip", "w") as archive:
        archive.writestr("hookprobe_zip.py", "VALUE = 'zip'\n")
    monkeypatch.syspath_prepend(str(tmp_path / "zipped.zip"))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("hookprobe")]:
        del sys.modules[name]
    for finder in _hook.installed():
        _hook.uninstall(finder)


def test_callback_runs_once_after_the_module_executed_and_the_hook_leaves(tree) -> None:
    seen = []
    finder = _hook.install(
        "hookprobe_pkg.target", lambda: seen.append(sys.modules["hookprobe_pkg.target"].VALUE)
    )
    assert _hook.install("hookprobe_pkg.target", lambda: None) is finder  # no duplicate
    import hookprobe_pkg  # the parent alone does not fire

    assert seen == []
    from hookprobe_pkg import target

    assert seen == [41]
    assert finder not in sys.meta_path
    # Loader attributes are the real loader's again, and the module saw no proxy at rest.
    assert type(target.__loader__) is importlib.machinery.SourceFileLoader
    assert type(target.__spec__.loader) is importlib.machinery.SourceFileLoader
    assert hookprobe_pkg.target is target
    importlib_reload = __import__("importlib").reload
    importlib_reload(target)
    assert seen == [41]


def test_callback_waits_for_half_imported_modules_under_the_defer_prefix(tree) -> None:
    seen = []

    def callback() -> None:
        outer = sys.modules["hookprobe_pkg.outer"]
        seen.append(getattr(outer, "DONE", False))

    finder = _hook.install("hookprobe_pkg.target", callback, defer_prefix="hookprobe_pkg.")
    import hookprobe_pkg.outer

    assert seen == [True]  # ran only once outer (and inner) had finished executing
    assert finder not in sys.meta_path
    assert hookprobe_pkg.outer.DONE


def test_a_failing_deferring_module_no_longer_holds_the_callback_back(tree) -> None:
    seen = []
    finder = _hook.install("hookprobe_pkg.target", lambda: seen.append(1), "hookprobe_pkg.")
    with pytest.raises(ValueError, match="late"):
        import hookprobe_pkg.failing_outer  # noqa: F401
    assert seen == [1]
    assert finder not in sys.meta_path


def test_namespace_packages_and_zipimport_still_load(tree) -> None:
    fired = []
    _hook.install("hookprobe_ns.leaf", lambda: fired.append("ns"))
    _hook.install("hookprobe_zip", lambda: fired.append("zip"))
    import hookprobe_ns.leaf
    import hookprobe_zip

    assert hookprobe_ns.leaf.VALUE == "ns"
    assert hookprobe_zip.VALUE == "zip"
    assert type(hookprobe_zip.__loader__).__name__ == "zipimporter"
    assert sorted(fired) == ["ns", "zip"]


def test_failed_import_does_not_fire_and_keeps_watching(tree) -> None:
    fired = []
    finder = _hook.install("hookprobe_pkg.broken", lambda: fired.append(1))
    with pytest.raises(ImportError, match="broken on purpose"):
        import hookprobe_pkg.broken  # noqa: F401
    assert fired == []
    assert finder in sys.meta_path


def test_a_failing_callback_does_not_fail_the_import(tree, capsys) -> None:
    def explode() -> None:
        raise RuntimeError("callback exploded")

    _hook.install("hookprobe_pkg.target", explode)
    import hookprobe_pkg.target

    assert hookprobe_pkg.target.VALUE == 41
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert "callback exploded" in err[0]


def test_other_finders_are_asked_directly_and_only_for_the_target(tree) -> None:
    calls = []

    class Spy:
        def find_spec(self, name, path=None, target=None):
            calls.append(name)

    _hook.install("hookprobe_pkg.target", lambda: None)
    sys.meta_path.insert(1, Spy())  # right after our finder
    try:
        import hookprobe_ns.leaf  # noqa: F401 - unrelated: we return None, Spy sees it once
        import hookprobe_pkg.target  # noqa: F401 - we ask Spy ourselves, then PathFinder

        assert calls.count("hookprobe_ns.leaf") == 1
        assert calls.count("hookprobe_pkg.target") == 1
    finally:
        sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "Spy"]


def test_concurrent_imports_fire_once_without_deadlock(tree) -> None:
    fired = []
    lock = threading.Lock()

    def callback() -> None:
        with lock:
            fired.append(threading.current_thread().name)
        import hookprobe_ns.leaf  # the callback may import; no lock of ours is held  # noqa: F401

    _hook.install("hookprobe_pkg.target", callback)
    threads = [
        threading.Thread(target=__import__, args=("hookprobe_pkg.target",), name=f"t{i}")
        for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert not any(t.is_alive() for t in threads)
    assert len(fired) == 1
