"""The .pth and .start files land in site-packages for every install mode, and leave with it."""

from __future__ import annotations

import tarfile
import zipfile

import pytest

from tests._venv import ROOT, Venv, make_venv

pytestmark = pytest.mark.timeout(600)

SITE_FILES = ("reloadpg_autopatch.pth", "reloadpg_autopatch.start")

# Never imports anything of ours: it only looks at what torch.distributed now holds.
PROBE = r"""
import json, sys
out = {"at_start": sorted(m for m in sys.modules if m.startswith("reloadpg_autopatch"))}
import torch.distributed as dist
fn = dist.all_gather_into_tensor
out["patched"] = getattr(fn, "__reloadpg_autopatch__", False) is True
out["wrapped_original"] = getattr(getattr(fn, "__wrapped__", None), "__module__", None)
out["at_end"] = sorted(m for m in sys.modules if m.startswith("reloadpg_autopatch"))
print(json.dumps(out))
"""


def check_installed(venv: Venv) -> None:
    for name in SITE_FILES:
        installed = venv.purelib / name
        assert installed.is_file(), f"{name} missing from {venv.purelib}"
        assert installed.read_text() == (ROOT / name).read_text()

    on = venv.script(PROBE, SLIME_RELOADABLE_PG="1")
    assert on["patched"]
    assert on["wrapped_original"] == "torch.distributed.distributed_c10d"
    assert "reloadpg_autopatch._startup.bootstrap" in on["at_start"]
    assert "torch" not in " ".join(on["at_start"])
    assert on["_stderr"] == ""

    off = venv.script(PROBE)
    assert not off["patched"]
    assert off["at_start"] == off["at_end"] == []
    assert off["_stderr"] == ""


def check_uninstalled(venv: Venv) -> None:
    venv.pip("uninstall", "--yes", "reloadpg_autopatch")
    for name in SITE_FILES:
        assert not (venv.purelib / name).exists(), f"{name} left behind by pip uninstall"
    assert not (venv.purelib / "reloadpg_autopatch").exists()
    off = venv.script(PROBE, SLIME_RELOADABLE_PG="1")  # the gate alone does nothing now
    assert not off["patched"]


def test_wheel_install_and_uninstall(tmp_path) -> None:
    venv = make_venv(tmp_path / "wheel")
    venv.pip("install", "--no-deps", str(ROOT))
    check_installed(venv)
    check_uninstalled(venv)


def test_editable_install_and_uninstall(tmp_path) -> None:
    venv = make_venv(tmp_path / "editable")
    venv.pip("install", "--no-deps", "--editable", str(ROOT))
    assert any(p.name.startswith("__editable__") for p in venv.purelib.iterdir())
    check_installed(venv)
    check_uninstalled(venv)


def test_sdist_carries_the_files_and_its_wheel_installs_them(built, installed) -> None:
    with tarfile.open(built["sdist"]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert set(SITE_FILES) <= names
    assert {"setup.py", "setup.cfg", "MANIFEST.in"} <= names
    with zipfile.ZipFile(built["wheel"]) as wheel:  # this wheel was built from the sdist
        assert set(SITE_FILES) <= set(wheel.namelist())
    check_installed(installed)
