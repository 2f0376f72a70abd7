"""Fresh virtual environments with the package installed the way a user installs it.

A venv made with ``--system-site-packages`` by a Python that itself runs in a venv would see
the *base* interpreter's site-packages, not the test environment's torch. So each venv here is
bare (``--without-pip``: pip runs from the test environment with ``--python``) and gets a path
file whose name sorts before ``reloadpg_autopatch.pth``: torch and megatron-core are importable
when our line runs.

That file names a view of the test environment's site-packages (a folder of links to its
entries, beside the venv) without any copy of this package: one installed there non-editable
would make pip answer "already installed with the same version" and install nothing, and would
come before an editable install's finder on ``sys.path``; either way a test would run the outer
copy. ``Venv.install`` installs exactly the artifact it is given and checks where it imports from.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from tests.support import ROOT
from tests.support.locks import machine_lock

# Every stderr line this package writes starts with its name; site reports a failing .pth line
# and an uncaught error starts a traceback. Anything else (torch's CUDA build logs "No CUDA
# runtime is found" on a GPU-less machine) is not ours to assert on.
_REPORTED = ("reloadpg_autopatch", "Error processing line", "Traceback (most recent call last)")


def reported(stderr: str) -> list[str]:
    """The lines of ``stderr`` that are ours, or a failure that a test must see."""
    return [line for line in stderr.splitlines() if line.startswith(_REPORTED)]


def clean_env(**overrides: str | None) -> dict[str, str]:
    """The current environment without our variables or PYTHONPATH, plus ``overrides``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SLIME_RELOADABLE_PG") and k not in ("PYTHONPATH", "PYTHONSTARTUP")
    }
    env["PYTHONWARNINGS"] = "ignore"
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@dataclass
class Venv:
    root: Path
    python: Path
    purelib: Path

    def run(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        timeout: float = 120,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.python), *args],
            env=env if env is not None else clean_env(),
            cwd=str(cwd or self.root),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def script(self, source: str, *, timeout: float = 120, **env: str | None) -> dict:
        """Run ``source`` (which prints one JSON object last) with the given variables."""
        proc = self.run("-c", source, env=clean_env(**env), timeout=timeout)
        if proc.returncode != 0:
            raise AssertionError(f"script failed ({proc.returncode}):\n{proc.stderr}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        result["_stderr"] = proc.stderr
        return result

    def pip(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(self.python), *args],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise AssertionError(f"pip {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def install(self, target: Path, *, editable: bool = False) -> None:
        """Install exactly ``target`` (a wheel, an sdist or, with ``editable``, a source tree).

        ``--ignore-installed``: whatever this venv can see, pip neither skips the install nor
        uninstalls anything outside it. Then the package must import from this venv (from
        ``target`` when editable), as installed from ``target``.
        """
        flags = ["--no-deps", "--ignore-installed", *(["--editable"] if editable else [])]
        # A source tree is built where it lies (its egg-info written there): one at a time.
        with machine_lock("build") if Path(target).is_dir() else contextlib.nullcontext():
            self.pip("install", *flags, str(target))
        found = self.script(_WHERE)
        home = Path(target).resolve() if editable else self.purelib
        expected = {
            "site": str(self.purelib),
            "url": Path(target).resolve().as_uri(),
            "origin": str(home / "reloadpg_autopatch" / "__init__.py"),
        }
        got = {key: found[key] for key in expected}
        if got != expected:
            raise AssertionError(f"{target} is not what {self.root} imports: {got} != {expected}")


# Where a venv finds the package, without importing it: its origin, the site directory of the
# first installed copy importlib.metadata finds, and the artifact pip installed that copy from.
_WHERE = r"""
import importlib.metadata, importlib.util, json
copy = importlib.metadata.distribution("reloadpg_autopatch")
print(json.dumps({
    "origin": importlib.util.find_spec("reloadpg_autopatch").origin,
    "site": str(copy.locate_file("")),
    "url": json.loads(copy.read_text("direct_url.json") or "{}").get("url"),
}))
"""


def _ours(name: str) -> bool:
    """Whether a site-packages entry is this package's: its code, metadata, site files, or an
    editable install's path file and finder."""
    name = re.sub(r"[-_.]+", "_", name.lower())
    return name.startswith(("reloadpg_autopatch", "_editable_reloadpg_autopatch"))


def outer_view(site: Path, into: Path) -> Path:
    """A folder of links to the entries of ``site``, except this package's (see ``_ours``)."""
    into.mkdir()
    for entry in site.iterdir():
        if not _ours(entry.name):
            (into / entry.name).symlink_to(entry)
    return into


def make_venv(root: Path, *, reuse_test_packages: bool = True, outer: Path | None = None) -> Venv:
    """A bare venv; with ``reuse_test_packages`` it also sees the packages of ``outer`` (this
    environment's site-packages unless given), this package's own excepted."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    if reuse_test_packages:
        # Beside the venv, not in it: pip never uninstalls what lies outside the environment
        # (a path that starts with the venv's own, like ROOT-outer-site, counts as inside).
        site = outer or Path(sysconfig.get_paths()["purelib"])
        view = outer_view(site, root.parent / f"outer-site-of-{root.name}")
        (purelib / "00-reloadpg-test-outer-site.pth").write_text(f"{view}\n", encoding="utf-8")
    return Venv(root, python, purelib)


def build(out: Path, *flags: str) -> list[Path]:
    """``python -m build`` this checkout into ``out`` (isolated, as pip and CI build it).

    One build of the checkout at a time on the machine: setuptools writes its egg-info into
    the source tree, which the other test lane may be building at the same moment.
    """
    with machine_lock("build"):
        proc = subprocess.run(
            [sys.executable, "-m", "build", *flags, "--outdir", str(out), str(ROOT)],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
    if proc.returncode != 0:
        raise AssertionError(f"python -m build failed:\n{proc.stdout}\n{proc.stderr}")
    return sorted(out.iterdir())
