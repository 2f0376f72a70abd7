"""Installed where site never looks, the package says so: it never does nothing silently.

``pip install --target DIR`` with ``PYTHONPATH=DIR`` puts the package (and its ``.pth``) where
``site`` never processes ``.pth`` files, so the gate cannot activate it (issue 33, item 6). The
lifecycle API then raises a clear error instead of destroying nothing, and the doctor says why.

Installed as a user installs it: the wheel ``python -m build`` makes, by ``pip install
--target`` into a folder, used from a fresh venv that sees torch but no copy of the package.
The oracles are torch's own: whether ``torch.distributed``'s functions were replaced, and how
many groups torch holds (``_world.pg_map``) before and after a cycle.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.venv import Venv, clean_env, make_venv

pytestmark = pytest.mark.timeout(600)

# A one-rank world; the three lifecycle calls before any activation; then the fix the error
# names (an explicit patch) and one cycle of a group made after it.
PROGRAM = r"""
import json, warnings
warnings.simplefilter("ignore")
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
import reloadpg_autopatch as rpg

out = {"home": rpg.__file__, "patched": hasattr(dist.all_reduce, "__reloadpg_autopatch__")}
store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
held = dist.new_group([0])
for name in ("register_default_process_group", "destroy_process_groups", "reload_process_groups"):
    try:
        getattr(rpg, name)()
        out[name] = ["returned", "", False]
    except Exception as error:
        out[name] = [type(error).__name__, str(error), isinstance(error, rpg.ReloadPGError)]
rpg.monkey_patch_torch_dist()
rpg.set_wrap_policy("all")
later = dist.new_group([0])
counts = [len(c10d._world.pg_map)]
rpg.destroy_process_groups()
counts.append(len(c10d._world.pg_map))
rpg.reload_process_groups()
counts.append(len(c10d._world.pg_map))
out["pg_map after the fix"] = counts
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def target(built, tmp_path_factory) -> tuple[Venv, Path]:
    """A venv that sees torch, and the wheel installed with ``pip install --target``."""
    root = tmp_path_factory.mktemp("target")
    venv = make_venv(root / "venv")
    folder = root / "target"
    venv.pip("install", "--no-deps", "--target", str(folder), str(built["wheel"]))
    assert (folder / "reloadpg_autopatch.pth").is_file()  # installed, where site never looks
    return venv, folder


@pytest.mark.parametrize("gate", ["1", None], ids=["gate-on", "gate-unset"])
def test_the_lifecycle_api_refuses_to_do_nothing_where_the_package_never_activated(
    target: tuple[Venv, Path], gate: str | None
) -> None:
    """Each of ``register_default_process_group``, ``destroy_process_groups`` and
    ``reload_process_groups`` raises a ``ReloadPGError`` that says the package is not active,
    why (the gate on with a ``.pth`` that never ran: ``--target``; or the gate unset), and the
    fix; the fix it names (``monkey_patch_torch_dist()``) then makes a cycle free and rebuild a
    group (torch's own map of groups shrinks and grows back)."""
    venv, folder = target
    env = clean_env(SLIME_RELOADABLE_PG=gate, PYTHONPATH=str(folder))
    proc = venv.run("-c", PROGRAM, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(out["home"]).is_relative_to(folder)
    assert out["patched"] is False
    for name in (
        "register_default_process_group",
        "destroy_process_groups",
        "reload_process_groups",
    ):
        kind, text, ours = out[name]
        assert (kind, ours) == ("ReloadPGError", True), (name, out[name])
        assert f"reloadpg_autopatch.{name}(): the package is not active" in text, text
        assert "monkey_patch_torch_dist()" in text, text
        assert "is_patched()" in text, text
        if gate == "1":
            assert "--target" in text, text
            assert "PYTHONPATH" in text, text
        else:
            assert "SLIME_RELOADABLE_PG is unset" in text, text
    before, destroyed, reloaded = out["pg_map after the fix"]
    assert (destroyed, reloaded) == (before - 1, before), out["pg_map after the fix"]


def test_the_doctor_says_why_a_target_install_is_never_activated(
    target: tuple[Venv, Path],
) -> None:
    """With the gate on, the doctor's problem names the folder, ``--target`` and why (site runs
    ``.pth`` files only in site-packages), and it exits non-zero."""
    venv, folder = target
    env = clean_env(SLIME_RELOADABLE_PG="1", PYTHONPATH=str(folder))
    proc = venv.run("-m", "reloadpg_autopatch", "doctor", "--json", env=env, timeout=180)
    assert proc.returncode != 0, proc.stdout[-3000:]
    problems = json.loads(proc.stdout)["problems"]
    said = [p for p in problems if str(folder) in p]
    assert len(said) == 1, problems
    assert "--target" in said[0], said[0]
    assert "only in site-packages" in said[0], said[0]
