"""``python -m reloadpg_autopatch doctor`` in a venv where the wheel is installed."""

from __future__ import annotations

import json

import pytest

from tests.support.venv import clean_env

pytestmark = pytest.mark.timeout(300)


def doctor(venv, *args: str, flags: tuple[str, ...] = (), **env: str | None):
    proc = venv.run(*flags, "-m", "reloadpg_autopatch", "doctor", *args, env=clean_env(**env))
    return proc


def test_healthy_install_exits_zero_and_says_what_is_patched(installed) -> None:
    proc = doctor(
        installed,
        "--import",
        "megatron.core",
        "megatron.core.tensor_parallel",
        SLIME_RELOADABLE_PG="1",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "verdict: healthy" in out
    assert "torch.distributed patched: yes" in out
    assert "stale refs   none" in out
    assert "all_gather_single" in out  # a forwarded method, named
    assert str(installed.purelib / "reloadpg_autopatch.pth") in out

    report = json.loads(doctor(installed, "--json", SLIME_RELOADABLE_PG="1").stdout)
    assert report["verdict"] == "healthy"
    assert report["torch"]["patched"] is True
    assert "all_gather_single" in report["torch"]["patched_functions"]
    assert report["gate"] == {"variable": "SLIME_RELOADABLE_PG", "value": "1", "verdict": "on"}
    assert report["pth"]["installed"]
    assert report["pth"]["current"]
    assert report["start"]["installed"]
    assert "reduce_scatter_single" in report["forwarding"]["methods"]


def test_gate_off_is_healthy_but_says_inactive(installed) -> None:
    proc = doctor(installed)
    assert proc.returncode == 0
    assert "torch.distributed patched: no" in proc.stdout
    assert "verdict: healthy, inactive (gate off)" in proc.stdout


def test_stale_reference_exits_one_and_names_it(installed, tmp_path) -> None:
    (tmp_path / "stale_probe.py").write_text(
        "from torch.distributed.distributed_c10d import _rank_not_in_group as bound_helper\n"
    )
    proc = doctor(
        installed, "--import", "stale_probe", SLIME_RELOADABLE_PG="1", PYTHONPATH=str(tmp_path)
    )
    assert proc.returncode == 1, proc.stdout
    assert "stale_probe.bound_helper" in proc.stdout
    assert "SLIME_RELOADABLE_PG_REBIND" in proc.stdout


def test_invalid_gate_and_failed_import_are_problems(installed) -> None:
    proc = doctor(installed, "--import", "no_such_module_xyz", SLIME_RELOADABLE_PG="maybe")
    assert proc.returncode == 1
    assert "-> invalid" in proc.stdout
    assert "--import no_such_module_xyz failed: ModuleNotFoundError" in proc.stdout


def test_site_disabled_reports_the_pth_was_not_processed(installed) -> None:
    import sysconfig

    path = f"{installed.purelib}:{sysconfig.get_paths()['purelib']}"
    proc = doctor(installed, flags=("-S",), SLIME_RELOADABLE_PG="1", PYTHONPATH=path)
    assert proc.returncode == 1
    assert "processing OFF (-S)" in proc.stdout
    assert "reloadpg_autopatch.pth was not processed" in proc.stdout
    assert "torch.distributed patched: no" in proc.stdout


def test_usage_errors_exit_two(installed) -> None:
    assert doctor(installed, "--bogus").returncode == 2
    assert installed.run("-m", "reloadpg_autopatch", env=clean_env()).returncode == 2


def test_doctor_reports_each_fidelity_mechanism(installed) -> None:
    report = json.loads(doctor(installed, "--json", SLIME_RELOADABLE_PG="1").stdout)
    fidelity = report["fidelity"]
    assert fidelity["c10d"]["installed"] >= 40
    assert fidelity["c10d"]["displaced"] == []
    assert fidelity["compile"] == {"loaded": False, "waiting": True}
    assert fidelity["mode"]["mode"] == "wrapper"
    # Once torch.compile's table is loaded, every remappable collective of ours is in it.
    loaded = json.loads(
        doctor(
            installed,
            "--json",
            "--import",
            "torch.distributed._functional_collectives",
            SLIME_RELOADABLE_PG="1",
        ).stdout
    )
    assert loaded["verdict"] == "healthy"
    compile_info = loaded["fidelity"]["compile"]
    assert compile_info["loaded"] is True
    assert compile_info["missing"] == []
    assert {"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"} <= set(
        compile_info["registered"]
    )


def test_doctor_names_a_displaced_wrapper_and_a_bad_mode(installed, tmp_path) -> None:
    # Something that puts torch's original back into distributed_c10d after our patch.
    (tmp_path / "undo_probe.py").write_text(
        "import inspect\n"
        "from torch.distributed import distributed_c10d as c10d\n"
        "c10d.all_reduce = inspect.unwrap(c10d.all_reduce)\n"
    )
    proc = doctor(
        installed,
        "--import",
        "undo_probe",
        SLIME_RELOADABLE_PG="1",
        SLIME_RELOADABLE_PG_MODE="fastest",
        PYTHONPATH=str(tmp_path),
    )
    assert proc.returncode == 1, proc.stdout
    assert "distributed_c10d no longer holds our wrappers of: all_reduce" in proc.stdout
    assert "SLIME_RELOADABLE_PG_MODE='fastest' is not a mode" in proc.stderr  # at start-up
    assert "PROBLEM      SLIME_RELOADABLE_PG_MODE='fastest' is not a mode" in proc.stdout


def test_huge_values_are_cut_in_the_report(installed) -> None:
    huge = 131072 - 64  # about the largest one environment string Linux starts a process with
    proc = doctor(
        installed,
        SLIME_RELOADABLE_PG="x" * huge,
        SLIME_RELOADABLE_PG_MODE="m" * huge,
        SLIME_RELOADABLE_PG_LOG="L" * huge,
        SLIME_RELOADABLE_PG_REBIND="r;" * (huge // 2),
    )
    assert proc.returncode == 1, proc.stdout[:2000] + proc.stderr[:2000]
    assert len(proc.stdout) + len(proc.stderr) < 8000, proc.stdout[:2000]
    echoes = [line for line in proc.stdout.splitlines() if f"({huge} characters)" in line]
    assert len(echoes) >= 8, proc.stdout  # each of the four, as a value and as a problem
    assert max(len(line) for line in proc.stdout.splitlines()) < 300, proc.stdout


#: A second site directory, the user site (``pip install --user``), added as site adds it where
#: the user site is on (a venv turns it off): its ``.pth`` files are processed. Then the
#: doctor, and the file of the copy that was imported.
_SECOND_SITE = """
import json, site, sys
site.ENABLE_USER_SITE, site.USER_SITE = True, sys.argv[1]
site.addsitedir(sys.argv[1])
import reloadpg_autopatch
from reloadpg_autopatch.tools.doctor import diagnose, render
report = diagnose()
print(render(report))
print(json.dumps({"imported": reloadpg_autopatch.__file__, "report": report.to_dict()}))
"""


def test_a_second_copy_in_another_site_directory_is_a_problem_naming_each(
    installed, tmp_path
) -> None:
    """The wheel's copy in the venv's site-packages, and a second copy of it with its ``.pth``
    in another site directory (as ``pip install --user`` leaves one): the doctor is not
    healthy; it names both copies with their ``.pth`` and which one runs, the one Python
    imported (before: "healthy", naming one ``.pth``)."""
    import shutil

    second = tmp_path / "user-site"
    shutil.copytree(installed.purelib / "reloadpg_autopatch", second / "reloadpg_autopatch")
    shutil.copy(installed.purelib / "reloadpg_autopatch.pth", second)
    proc = installed.run("-c", _SECOND_SITE, str(second), env=clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    imported = out["imported"]
    assert imported.startswith(str(installed.purelib)), imported  # the oracle: Python's import
    report = out["report"]
    assert report["verdict"] == "problems found", report["problems"]
    (problem,) = [p for p in report["problems"] if "installed 2 times" in p]
    assert f"{installed.purelib} (runs;" in problem, problem
    assert f"{second} (shadowed, never imported;" in problem, problem
    assert problem.count("reloadpg_autopatch.pth beside it, which site runs") == 2, problem
    text = proc.stdout
    assert f"copy         {second} (shadowed" in text, text
