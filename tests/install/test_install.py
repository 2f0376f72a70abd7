"""The .pth and .start files land in site-packages for every install mode, and leave with it."""

from __future__ import annotations

import configparser
import email
import re
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.support.venv import ROOT, Venv, make_venv, reported

pytestmark = pytest.mark.timeout(600)

SITE_FILES = ("reloadpg_autopatch.pth", "reloadpg_autopatch.start")

# Never imports anything of ours: it only looks at what torch.distributed now holds. torch's
# modules are listed from sys.modules itself: start-up must not import torch, under any name.
PROBE = r"""
import json, sys
out = {
    "at_start": sorted(
        m for m in sys.modules if m.startswith(("reloadpg_autopatch", "_reloadpg_autopatch_boot"))
    ),
    "torch_at_start": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
}
import torch.distributed as dist
fn = dist.all_gather_into_tensor
out["patched"] = getattr(fn, "__reloadpg_autopatch__", False) is True
out["wrapped_original"] = getattr(getattr(fn, "__wrapped__", None), "__module__", None)
out["at_end"] = sorted(m for m in sys.modules if m.startswith("reloadpg_autopatch"))
print(json.dumps(out))
"""


def check_site_files(venv: Venv) -> None:
    for name in SITE_FILES:
        installed = venv.purelib / name
        assert installed.is_file(), f"{name} missing from {venv.purelib}"
        assert installed.read_text() == (ROOT / name).read_text()


def check_installed(venv: Venv) -> None:
    check_site_files(venv)

    on = venv.script(PROBE, SLIME_RELOADABLE_PG="1")
    assert on["patched"]
    assert on["wrapped_original"] == "torch.distributed.distributed_c10d"
    assert on["at_start"] == ["_reloadpg_autopatch_boot"]  # start-up imports one module
    assert on["torch_at_start"] == []
    assert reported(on["_stderr"]) == [], on["_stderr"]

    off = venv.script(PROBE)
    assert not off["patched"]
    assert off["at_start"] == off["at_end"] == []
    assert off["torch_at_start"] == []
    assert reported(off["_stderr"]) == [], off["_stderr"]


def check_uninstalled(venv: Venv, probe: str = PROBE) -> None:
    venv.pip("uninstall", "--yes", "reloadpg_autopatch")
    for name in SITE_FILES:
        assert not (venv.purelib / name).exists(), f"{name} left behind by pip uninstall"
    assert not (venv.purelib / "reloadpg_autopatch").exists()
    off = venv.script(probe, SLIME_RELOADABLE_PG="1")  # the gate alone does nothing now
    assert not off.get("patched")
    assert off["at_start"] == []


def test_wheel_install_and_uninstall(tmp_path) -> None:
    """pip installs the source tree as a wheel, then uninstalls it: a venv of its own, which
    the uninstall changes."""
    venv = make_venv(tmp_path / "wheel")
    venv.install(ROOT)
    check_installed(venv)
    check_uninstalled(venv)


def test_editable_install_and_uninstall(tmp_path) -> None:
    """An editable install, then its uninstall: a venv of its own, which the uninstall
    changes."""
    venv = make_venv(tmp_path / "editable")
    venv.install(ROOT, editable=True)
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


#: A Markdown link's target (images left out), and a fence that opens or closes a code block.
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _links(text: str) -> list[str]:
    """The link targets of Markdown prose (fenced code blocks left out)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out += LINK.findall(re.sub(r"`[^`]*`", "", line))
    return out


def _suite(root: Path) -> set[str]:
    """Every file of the test suite and of what it runs, relative to ``root``."""
    found = set()
    for folder in ("tests", "scripts"):
        for path in (root / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                found.add(path.relative_to(root).as_posix())
    return found


@pytest.mark.startup
def test_the_sdist_carries_the_whole_suite_and_every_link_resolves(built, tmp_path) -> None:
    """The sdist holds the test suite whole (``conftest.py``, ``tests/support`` and its
    programs, the scripts the suite runs), and every relative link of its README, changelog,
    contributing guide and ``docs/`` resolves to a file inside it."""
    with tarfile.open(built["sdist"]) as sdist:
        extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        sdist.extractall(tmp_path, **extra)  # noqa: S202 - our own sdist, just built
    (root,) = tmp_path.iterdir()
    assert _suite(ROOT) <= _suite(root), sorted(_suite(ROOT) - _suite(root))
    assert "tests/conftest.py" in _suite(root)
    pages = [root / "README.md", root / "CHANGELOG.md", root / "CONTRIBUTING.md"]
    pages += sorted((root / "docs").glob("*.md"))
    assert len(pages) > 4, pages
    dead = []
    for page in pages:
        for target in _links(page.read_text(encoding="utf-8")):
            path = target.partition("#")[0]
            if re.match(r"[a-z]+:", target) or not path:
                continue
            resolved = (page.parent / path).resolve()
            if not (resolved.is_file() and resolved.is_relative_to(root)):
                dead.append(f"{page.relative_to(root)}: {target}")
    assert dead == []


@pytest.mark.startup
def test_the_long_description_links_are_absolute_under_the_projects_url(built) -> None:
    """The package index shows the README where no relative link resolves: each of its links
    is absolute, and each one made from a relative link is setup.cfg's ``url`` + ``/blob/main/``
    + a file of the repository."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    base = config["metadata"]["url"].rstrip("/") + "/blob/main/"
    with tarfile.open(built["sdist"]) as sdist:
        info = next(
            m for m in sdist.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")
        )
        metadata = email.message_from_bytes(sdist.extractfile(info).read())
    links = _links(metadata.get_payload())
    readme = _links((ROOT / "README.md").read_text(encoding="utf-8"))
    relative = [t for t in readme if not re.match(r"[a-z]+:|#", t)]
    assert len(links) == len(readme), (len(links), len(readme))
    assert len(relative) > 10
    assert [t for t in links if not re.match(r"https://|#", t)] == []
    made = [t for t in links if t.startswith(base)]
    assert [t.removeprefix(base) for t in made] == relative
    for target in made:
        assert (ROOT / target.removeprefix(base).partition("#")[0]).is_file(), target


# Without torch: the gate on installs the hook and nothing else; importing torch.distributed
# then fails exactly as it would without the package.
NO_TORCH_PROBE = r"""
import json, sys
out = {
    "at_start": sorted(
        m for m in sys.modules if m.startswith(("reloadpg_autopatch", "_reloadpg_autopatch_boot"))
    ),
    "hooks": [type(f).__module__ for f in sys.meta_path if "reloadpg" in type(f).__module__],
    "torch_at_start": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
}
try:
    import torch.distributed
except ImportError as error:
    out["error"] = f"{type(error).__name__}: {error}"
print(json.dumps(out))
"""


@pytest.mark.startup
def test_wheel_installs_and_starts_up_without_torch(built, tmp_path) -> None:
    """A venv of its own, without torch and then uninstalled (the session's venvs keep torch)."""
    # Built by this test run's Python, which in the start-up lanes is 3.10, 3.12 or 3.13.
    venv = make_venv(tmp_path / "no-torch", reuse_test_packages=False)
    venv.install(built["wheel"])
    check_site_files(venv)

    on = venv.script(NO_TORCH_PROBE, SLIME_RELOADABLE_PG="1")
    # With the gate alone set, start-up imports one module, the boot module with its import
    # hooks: not the package, nor what checks or reports the other variables (``_startup``).
    assert on["at_start"] == ["_reloadpg_autopatch_boot"]
    # The finder waiting for torch.distributed, and the watcher of the frameworks' modules.
    assert on["hooks"] == ["_reloadpg_autopatch_boot"] * 2
    assert on["torch_at_start"] == []
    assert on["error"] == "ModuleNotFoundError: No module named 'torch'"
    assert on["_stderr"] == ""  # no torch here to log anything: every line would be ours

    off = venv.script(NO_TORCH_PROBE, SLIME_RELOADABLE_PG="0")
    assert off["at_start"] == off["hooks"] == off["torch_at_start"] == []
    assert off["error"] == "ModuleNotFoundError: No module named 'torch'"
    assert off["_stderr"] == ""

    check_uninstalled(venv, NO_TORCH_PROBE)


# What the interpreter of a venv imports and finds, without running the package (the gate is
# off): where the package comes from, each installed copy's site directory in the order
# importlib.metadata finds them, and the first copy's direct_url.json (pip's note of the artifact).
PROVENANCE = r"""
import importlib.metadata as metadata, json
import reloadpg_autopatch
copies = list(metadata.distributions(name="reloadpg_autopatch"))
print(json.dumps({
    "file": reloadpg_autopatch.__file__,
    "sites": [str(copy.locate_file("")) for copy in copies],
    "direct_url": json.loads(copies[0].read_text("direct_url.json") or "null"),
}))
"""


@pytest.fixture(scope="module")
def outer_with_the_package(built, tmp_path_factory) -> Venv:
    """An environment that already holds the package, non-editable and at the same version."""
    outer = make_venv(tmp_path_factory.mktemp("outer") / "outer", reuse_test_packages=False)
    outer.install(built["wheel"])
    assert (outer.purelib / "reloadpg_autopatch" / "__init__.py").is_file()
    return outer


@pytest.mark.startup
@pytest.mark.parametrize("artifact", ["wheel", "sdist", "editable"])
def test_a_venv_gets_exactly_the_artifact_whatever_is_installed_around_it(
    artifact, built, outer_with_the_package, tmp_path
) -> None:
    # A venv of its own, around which an outer copy of the package is installed.
    # pip, asked for a wheel of a version the environment around already holds, says "already
    # installed with the same version" and installs nothing; an editable copy comes after the
    # outer site-packages on sys.path. Either way the venv would test the outer copy.
    venv = make_venv(tmp_path / artifact, outer=outer_with_the_package.purelib)
    target = ROOT if artifact == "editable" else built[artifact]
    venv.install(target, editable=artifact == "editable")

    found = venv.script(PROVENANCE)
    assert found["sites"][0] == str(venv.purelib), found["sites"]
    assert found["direct_url"]["url"] == target.resolve().as_uri()
    if artifact == "editable":
        assert found["direct_url"]["dir_info"] == {"editable": True}
        assert found["file"] == str(ROOT / "reloadpg_autopatch" / "__init__.py")
        return
    assert found["file"] == str(venv.purelib / "reloadpg_autopatch" / "__init__.py")
    if artifact == "wheel":  # every file the wheel holds, byte for byte
        with zipfile.ZipFile(target) as wheel:
            for name in wheel.namelist():
                if ".dist-info/" not in name:
                    assert (venv.purelib / name).read_bytes() == wheel.read(name), name
