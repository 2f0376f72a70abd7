"""Shared fixtures. The pytest process itself is patched only by tests that ask for it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Children started by the tests must never inherit a gate or switch from the caller's shell.
for _name in [n for n in os.environ if n.startswith("SLIME_RELOADABLE_PG")]:
    del os.environ[_name]


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
    from tests._venv import build

    out = tmp_path_factory.mktemp("dist")
    files = build(out)
    return {
        "sdist": next(p for p in files if p.name.endswith(".tar.gz")),
        "wheel": next(p for p in files if p.name.endswith(".whl")),
    }


@pytest.fixture(scope="session")
def installed(built, tmp_path_factory):
    """A fresh venv with the wheel installed, reusing this environment's torch and megatron."""
    from tests._venv import make_venv

    venv = make_venv(tmp_path_factory.mktemp("venv") / "installed")
    venv.pip("install", "--no-deps", str(built["wheel"]))
    return venv
