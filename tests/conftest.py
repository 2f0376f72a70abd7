"""Shared fixtures, and a marker per folder. The pytest process itself is patched only by tests
that ask for it.

The folders are the kinds of test: ``unit/`` runs in this one process, ``ranks/`` starts
several rank processes (``tests/support/ranks.py``), ``install/`` builds wheels and venvs and
starts fresh interpreters the way a user's machine does. Each test gets its folder's marker, so
``pytest -m unit`` (``make test-unit``) is the quick local loop.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib.metadata import PackageNotFoundError, version

import pytest

# Children started by the tests must never inherit a gate or switch from the caller's shell.
for _name in [n for n in os.environ if n.startswith("SLIME_RELOADABLE_PG")]:
    del os.environ[_name]


TORCH_INSTALLED = importlib.util.find_spec("torch") is not None

#: The marker each folder gives its tests.
KINDS = ("unit", "ranks", "install")


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        kind = item.path.parent.name
        if kind in KINDS:
            item.add_marker(kind)


def pytest_report_header(config) -> str:
    # Without torch only the `startup` tests can run (`pytest -m startup`, `make test-startup`).
    if not TORCH_INSTALLED:
        return "torch: not installed; only the tests marked startup can run here (-m startup)"
    # Each torch lane pins its megatron-core (the Makefile's MEGATRON_SPEC): say which it got.
    found = []
    for name in ("torch", "megatron-core"):
        try:
            found.append(f"{name}: {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name}: no version found")
    return ", ".join(found)


class _ModuleWithoutTorch(pytest.Module):
    """A test module that imports torch at its top: without torch, skipped as a whole, saying so.

    The selection (``-m startup``) decides which tests run in the start-up lane; this only keeps
    modules it deselects entirely from failing collection. A module that holds a startup test
    must import without torch, so there the error stands.
    """

    def collect(self):
        try:
            return super().collect()
        except self.CollectError as error:
            cause = error.__cause__
            missing = isinstance(cause, ModuleNotFoundError) and cause.name == "torch"
            if not missing or "mark.startup" in self.path.read_text(encoding="utf-8"):
                raise
            pytest.skip(
                f"{self.path.name} imports torch, which this interpreter does not have (only "
                "the tests marked startup run without it)",
                allow_module_level=True,
            )


if not TORCH_INSTALLED:

    def pytest_pycollect_makemodule(module_path, parent):
        return _ModuleWithoutTorch.from_parent(parent, path=module_path)


@pytest.fixture(scope="session")
def patched_world():
    """This process, patched, with a one-rank gloo WORLD (for single-process unit tests)."""
    import torch.distributed as dist

    import reloadpg_autopatch

    reloadpg_autopatch.monkey_patch_torch_dist()
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def python() -> str:
    return sys.executable


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> dict:
    """An sdist and the wheel built *from* it (``python -m build``'s default), once a session."""
    from tests.support.venv import build

    out = tmp_path_factory.mktemp("dist")
    files = build(out)
    return {
        "sdist": next(p for p in files if p.name.endswith(".tar.gz")),
        "wheel": next(p for p in files if p.name.endswith(".whl")),
    }


@pytest.fixture(scope="session")
def installed(built, tmp_path_factory):
    """A fresh venv with the wheel installed, reusing this environment's packages.

    In the torch lanes that is torch and megatron-core; in the start-up lane, no torch at all.
    """
    from tests.support.venv import make_venv

    venv = make_venv(tmp_path_factory.mktemp("venv") / "installed")
    venv.install(built["wheel"])
    return venv


@pytest.fixture(scope="session")
def installed_without_torch(built, tmp_path_factory):
    """A fresh venv with the wheel installed and no torch, whatever this environment holds."""
    from tests.support.venv import make_venv

    venv = make_venv(tmp_path_factory.mktemp("venv") / "without-torch", reuse_test_packages=False)
    venv.install(built["wheel"])
    return venv


@pytest.fixture
def one_ray_cluster_at_a_time(monkeypatch):
    """Hold a machine-wide lock while this test runs its own Ray cluster, in ``/tmp/ray``.

    ``.ci/run`` runs two torch lanes at once; two local Ray clusters starting together on one
    machine compete for its ports and its session folder. Ray puts its session (Unix sockets
    among it) under ``TMPDIR`` on Linux, and a lane's own ``TMPDIR`` can make those paths too
    long for a socket, so the cluster goes to ``/tmp/ray`` (``RAY_TMPDIR``), where the lock
    lives too.
    """
    from tests.support.locks import machine_lock

    monkeypatch.setenv("RAY_TMPDIR", "/tmp")
    with machine_lock("ray"):
        yield
