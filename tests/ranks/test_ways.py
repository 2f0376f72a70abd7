"""The ways behind one interface: a way of the test's own takes part in every cycle.

``tests/support/keep_awake.py`` adds a way with one module and one ``ways.register`` call. The
lifecycle then chooses it for new groups in its mode, destroy and reload ask it what to do, the
ranks agree on its groups, and the cycle report names them, with no module of the package
changed. The oracles are torch's: the group's object identity, ``all_reduce`` results before,
between and after the cycle, and the groups torch creates (counted at its
``_new_process_group_helper``).
"""

from __future__ import annotations

import subprocess
from typing import Any

from tests.support.ranks import GATE, Rank, run_ranks, total


def _kept_awake(ctx: Rank) -> dict[str, Any]:
    from torch.distributed import distributed_c10d as c10d

    import reloadpg_autopatch as rpg
    from tests.support import keep_awake  # noqa: F401 - registers the way and its mode

    rpg.set_reload_mode("keep-awake")
    dist = ctx.begin()
    pair = dist.new_group([0, 1])
    mine = [dist.new_group([0]), dist.new_group([1])][ctx.rank]  # a non-member of the other
    created = []
    helper = c10d._new_process_group_helper

    def counting(*args: Any, **kwargs: Any) -> Any:
        created.append(kwargs.get("group_name") or args[3])
        return helper(*args, **kwargs)

    c10d._new_process_group_helper = counting
    out: dict[str, Any] = {"type": type(pair).__name__, "before": total(pair, ctx.rank + 1)}
    ids = (id(pair), id(mine))
    for cycle in range(2):
        rpg.destroy_process_groups()
        out[f"asleep {cycle}"] = [total(pair, 1.0), total(mine, 5.0)]
        rpg.reload_process_groups()
        out[f"awake {cycle}"] = total(pair, ctx.rank + 1)
    report = rpg.last_cycle_report()
    out["kept"] = sorted(report.destroy.groups.get("kept awake", []))
    out["names"] = sorted([str(pair.group_name), str(mine.group_name)])
    out["same objects"] = ids == (id(pair), id(mine))
    out["created"] = created
    out["listed"] = len(rpg.reloadable_groups())
    return out


def test_a_way_added_in_one_module_takes_part_in_every_cycle() -> None:
    for report in run_ranks(_kept_awake, 2, env=GATE):
        assert report["type"] == "ProcessGroup"  # torch's own object, no wrapper
        assert report["before"] == 3.0
        for cycle in range(2):
            assert report[f"asleep {cycle}"] == [2.0, 5.0]  # usable while the others sleep
            assert report[f"awake {cycle}"] == 3.0
        assert report["kept"] == report["names"]
        assert report["same objects"]
        assert report["created"] == []  # nobody, member or not, created anything for them
        assert report["listed"] == 2


# ---- a registered mode, chosen by the environment ------------------------------------------

_PLUGIN_PROGRAM = """
import torch.distributed as dist
import reloadpg_autopatch as rpg
rpg.set_wrap_policy("all")
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
pair = dist.new_group([0])
rpg.destroy_process_groups()
rpg.reload_process_groups()
print(rpg.get_reload_mode(), type(pair).__name__, rpg.last_cycle_report().destroy.groups)
"""


def _with_plugin(
    tmp_path: Any, name: str, program: str, mode: str | None = "keep-awake"
) -> subprocess.CompletedProcess:
    """Run ``program`` in a fresh interpreter with the gate on, ``SLIME_RELOADABLE_PG_MODE``
    set to ``mode`` (None: unset), and an installed distribution (its ``.dist-info`` on
    ``sys.path``) whose entry point in the ``reloadpg_autopatch.modes`` group, named ``name``,
    is the module that registers the keep-awake way and its mode
    (``tests/support/keep_awake.py``)."""
    import os
    import sys

    from tests.support import ROOT

    info = tmp_path / "keep_awake_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: keep-awake-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[reloadpg_autopatch.modes]\n{name} = tests.support.keep_awake\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLIME_RELOADABLE_PG")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    env |= GATE
    if mode is not None:
        env["SLIME_RELOADABLE_PG_MODE"] = mode
    return subprocess.run(
        [sys.executable, "-c", program],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_mode_a_plugin_registers_is_chosen_by_the_environment(tmp_path: Any) -> None:
    """``SLIME_RELOADABLE_PG_MODE=keep-awake``, where an installed distribution's entry point
    (group ``reloadpg_autopatch.modes``) registers that mode: start-up says nothing, the
    lifecycle loads the entry point when it first reads the mode, and the mode's way takes the
    groups (torch's own object, kept awake through the cycle). A fresh interpreter: the
    subject is what start-up and the first read of the variable do."""
    proc = _with_plugin(tmp_path, "keep-awake", _PLUGIN_PROGRAM)
    assert proc.returncode == 0, proc.stderr
    ours = [line for line in proc.stderr.splitlines() if "reloadpg_autopatch" in line]
    assert ours == [], proc.stderr
    mode, kind, groups = proc.stdout.split(" ", 2)
    assert (mode, kind) == ("keep-awake", "ProcessGroup"), proc.stdout
    assert "kept awake" in groups, proc.stdout


def test_a_mode_a_plugin_registers_is_chosen_by_set_reload_mode(tmp_path: Any) -> None:
    """``set_reload_mode("keep-awake")`` finds the mode an installed distribution registers, as
    the variable does, though nothing imported the plugin before; the same unknown name
    without such a plugin is refused with the modes there are. A fresh interpreter: the
    subject is the first lookup of the plugin."""
    program = (
        "import reloadpg_autopatch as rpg\n"
        "rpg.set_reload_mode('keep-awake')\n"
        "print(rpg.get_reload_mode())\n"
        "try:\n"
        "    rpg.set_reload_mode('keep-awake-two')\n"
        "except ValueError as error:\n"
        "    print('refused', error)\n"
    )
    proc = _with_plugin(tmp_path, "keep-awake", program, mode=None)
    assert proc.returncode == 0, proc.stderr
    chosen, refused = proc.stdout.splitlines()
    assert chosen == "keep-awake", proc.stdout
    assert refused.startswith("refused reload mode must be one of"), refused
    assert "'keep-awake'" in refused, refused  # the modes there are: the plugin's among them
    assert "'keep-awake-two'" in refused, refused


def test_a_mode_no_plugin_registers_is_refused_in_one_line(tmp_path: Any) -> None:
    """A plugin installed under another name does not make an unknown mode: one line at
    start-up names the variable and the modes there are, and the wrapper mode is used."""
    proc = _with_plugin(tmp_path, "keep-awake-two", _PLUGIN_PROGRAM)
    assert proc.returncode == 0, proc.stderr
    ours = [line for line in proc.stderr.splitlines() if line.startswith("reloadpg_autopatch")]
    assert len(ours) == 1, proc.stderr
    assert "SLIME_RELOADABLE_PG_MODE='keep-awake'" in ours[0], ours
    assert "keep-awake-two" in ours[0], ours  # the plugin's mode, among those there are
    assert proc.stdout.split(" ", 2)[:2] == ["wrapper", "ReloadableProcessGroup"], proc.stdout
