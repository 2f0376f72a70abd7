"""Start-up activation in fresh interpreters of a venv where the wheel is installed."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support.venv import ROOT, clean_env, make_venv, reported

pytestmark = pytest.mark.timeout(300)

# Cheap: no torch import, so ten gate values cost ten bare interpreter starts. It lists torch's
# own modules too: whatever a gate value does at start-up, torch must not be imported by it.
GATE_PROBE = r"""
import json, sys
print(json.dumps({
    "loaded": sorted(
        m for m in sys.modules if m.startswith(("reloadpg_autopatch", "_reloadpg_autopatch_boot"))
    ),
    "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
    "hooks": sum(type(f).__module__ == "_reloadpg_autopatch_boot" for f in sys.meta_path),
}))
"""


@pytest.mark.startup
@pytest.mark.parametrize(
    ("value", "activates", "warns"),
    [
        ("1", True, False),
        ("TRUE", True, False),
        (" yes ", True, False),
        ("on", True, False),
        ("", False, False),
        ("0", False, False),
        ("off", False, False),
        ("2", False, True),
        ("maybe", False, True),
        ("1; import os", False, True),
    ],
)
def test_gate_values(installed, value, activates, warns) -> None:
    proc = installed.run("-c", GATE_PROBE, env=clean_env(SLIME_RELOADABLE_PG=value))
    assert proc.returncode == 0
    import json

    result = json.loads(proc.stdout)
    assert (result["hooks"] > 0) is activates
    assert result["torch"] == []
    if not activates and not warns:
        assert result["loaded"] == []  # nothing of ours is even imported
    lines = reported(proc.stderr)
    if warns:
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith("reloadpg_autopatch: SLIME_RELOADABLE_PG=")
        assert repr(value) in lines[0]
        assert "1, true, yes, on" in lines[0]
    else:
        assert lines == []


@pytest.mark.startup
@pytest.mark.parametrize(
    ("env", "checked"),
    [
        ({"SLIME_RELOADABLE_PG": "1"}, False),
        ({"SLIME_RELOADABLE_PG": "on", "SLIME_RELOADABLE_PG_MODE": ""}, False),
        ({"SLIME_RELOADABLE_PG": "1", "SLIME_RELOADABLE_PG_MODE": "suspend"}, True),
        ({"SLIME_RELOADABLE_PG": "1", "SLIME_RELOADABLE_PG_LOG": "LOUD"}, True),
    ],
)
def test_the_gate_alone_imports_the_boot_module_alone(installed, env: dict, checked: bool) -> None:
    """The gate on and no other variable of ours set: one module at start-up, the boot module
    (``_reloadpg_autopatch_boot``). Another variable set: its value is checked at start-up
    (``_startup``), a bad one said there, and torch is never imported for it."""
    proc = installed.run("-c", GATE_PROBE, env=clean_env(**env))
    assert proc.returncode == 0, proc.stderr
    import json

    out = json.loads(proc.stdout)
    assert out["hooks"] == 2, out  # the finder of torch.distributed, the adoption's watcher
    assert out["torch"] == [], out
    assert "_reloadpg_autopatch_boot" in out["loaded"], out
    assert ("reloadpg_autopatch._startup" in out["loaded"]) is checked, out
    if not checked:
        assert out["loaded"] == ["_reloadpg_autopatch_boot"], out
    bad = env.get("SLIME_RELOADABLE_PG_LOG") == "LOUD"
    assert ("SLIME_RELOADABLE_PG_LOG" in proc.stderr) is bad, proc.stderr


@pytest.mark.startup
def test_processing_the_pth_twice_activates_once(installed) -> None:
    # A venv processes .pth files twice on some Pythons (cpython#75723); so can a re-run of site.
    source = (
        "import json, site, sys; site.addsitedir(sys.argv[1]); "
        "print(json.dumps({'hooks': sum(type(f).__module__ == '_reloadpg_autopatch_boot' "
        "for f in sys.meta_path)}))"
    )
    # One activation installs two: the finder waiting for torch.distributed and the watcher of
    # the frameworks' lifecycle modules (adoption).
    for gate, warnings in (("1", 0), ("maybe", 1)):
        proc = installed.run(
            "-c", source, str(installed.purelib), env=clean_env(SLIME_RELOADABLE_PG=gate)
        )
        assert proc.returncode == 0, proc.stderr
        assert '"hooks": ' + ("2" if gate == "1" else "0") in proc.stdout
        assert len(reported(proc.stderr)) == warnings, proc.stderr


@pytest.mark.startup
@pytest.mark.parametrize("broken", ["missing", "raises", "syntax"])
def test_a_broken_package_never_stops_the_interpreter(tmp_path, broken) -> None:
    """A venv of its own, whose copy of the package the test breaks."""
    venv = make_venv(tmp_path / "broken", reuse_test_packages=False)
    (venv.purelib / "reloadpg_autopatch.pth").write_text(
        (ROOT / "reloadpg_autopatch.pth").read_text()
    )
    if broken != "missing":
        package = venv.purelib / "reloadpg_autopatch"
        package.mkdir()
        body = "raise RuntimeError('broken copy')\n" if broken == "raises" else "def (:\n"
        (package / "__init__.py").write_text(body)
    proc = venv.run("-c", "print(1)", env=clean_env(SLIME_RELOADABLE_PG="1"))
    assert proc.returncode == 0
    assert proc.stdout == "1\n"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("reloadpg_autopatch")


def test_a_failing_patch_is_reported_once_and_torch_still_imports(installed) -> None:
    result = installed.script(
        "import json, torch.distributed as d; d.init_process_group; "
        "print(json.dumps({'patched': hasattr(d.all_reduce, '__reloadpg_autopatch__')}))",
        SLIME_RELOADABLE_PG="1",
        SLIME_RELOADABLE_PG_INJECT_FAILURE="patch",
    )
    assert result["patched"] is False
    lines = reported(result["_stderr"])
    assert len(lines) == 1, result["_stderr"]
    assert "failure injected" in lines[0]
    assert lines[0].startswith("reloadpg_autopatch: patching torch.distributed failed")


THREADS = r"""
import json, threading
errors = []
def load(name):
    try:
        __import__(name)
    except BaseException as error:
        errors.append(repr(error))
threads = [threading.Thread(target=load, args=(n,)) for n in ("torch.distributed", "megatron.core")]
for t in threads: t.start()
for t in threads: t.join(timeout=120)
alive = [t.is_alive() for t in threads]
import torch.distributed as dist
import megatron.core.tensor_parallel.mappings as mappings
print(json.dumps({
    "alive": alive, "errors": errors,
    "patched": hasattr(dist.all_gather_into_tensor, "__reloadpg_autopatch__"),
    "megatron_binding": hasattr(mappings.dist_all_gather_func, "__reloadpg_autopatch__"),
}))
"""


def test_concurrent_imports_do_not_deadlock(installed) -> None:
    result = installed.script(THREADS, SLIME_RELOADABLE_PG="1", timeout=200)
    assert result["alive"] == [False, False]
    assert result["errors"] == []
    assert result["patched"]
    assert result["megatron_binding"]


@pytest.mark.parametrize(
    "first_import",
    [
        "import reloadpg_autopatch; reloadpg_autopatch.ReloadableProcessGroup",
        "from reloadpg_autopatch.groups.world import registration",
        "import reloadpg_autopatch.groups.lifecycle",
        "from reloadpg_autopatch.tools import bindings; bindings.check(bindings.find_bindings())",
    ],
)
def test_our_own_module_may_be_the_first_to_import_torch(installed, first_import) -> None:
    result = installed.script(
        f"import json\n{first_import}\nimport torch.distributed as d\n"
        "print(json.dumps({'patched': hasattr(d.all_reduce, '__reloadpg_autopatch__')}))",
        SLIME_RELOADABLE_PG="1",
    )
    assert result["patched"]
    assert reported(result["_stderr"]) == [], result["_stderr"]


# What the patch loads of ours as torch.distributed is imported, and whether it patched
# (new_group: patched in every mode; in suspend mode on torch 2.14 the collectives are torch's
# own, every group being torch's own object).
LOADED_BY_THE_PATCH = (
    "import json, sys\n"
    "import torch.distributed as d\n"
    "print(json.dumps({'patched': hasattr(d.new_group, '__reloadpg_autopatch__'), "
    "'loaded': sorted(m for m in sys.modules if m.startswith('reloadpg_autopatch.'))}))\n"
)


@pytest.mark.parametrize("mode", ["wrapper", "suspend"])
def test_the_patch_loads_the_wrappers_class_and_no_way_in_wrapper_mode(installed, mode) -> None:
    """The patch runs the moment torch.distributed is imported, in every process where the gate
    is on. In wrapper mode it needs the wrapper's class alone (before: every way and the
    lifecycle's answers and rounds, 76 modules, 4.9% of the import); in suspend mode it asks
    the ways whether any group needs a wrapper, and loads them."""
    result = installed.script(
        LOADED_BY_THE_PATCH, SLIME_RELOADABLE_PG="1", SLIME_RELOADABLE_PG_MODE=mode
    )
    loaded = set(result["loaded"])
    assert result["patched"], result
    assert "reloadpg_autopatch.groups.ways.wrapper.group" in loaded
    ways = {
        "reloadpg_autopatch.groups.ways.catalog",
        "reloadpg_autopatch.groups.ways.wrapper.way",
        "reloadpg_autopatch.groups.ways.suspend",
        "reloadpg_autopatch.groups.ways.inplace",
        "reloadpg_autopatch.groups.agreement",
    }
    if mode == "wrapper":
        assert loaded & ways == set(), sorted(loaded & ways)
    else:
        assert ways <= loaded, sorted(ways - loaded)


def test_a_bad_mode_is_said_once_whichever_layer_reads_it_first(installed) -> None:
    """Start-up checks the value and says it; the lifecycle reads the mode again once torch is
    imported, and does not say it a second time (``_env.first_report``)."""
    source = (
        "import json\n"
        "import torch.distributed\n"
        "from reloadpg_autopatch.groups import mode\n"
        "print(json.dumps({'mode': mode.get_reload_mode()}))\n"
    )
    result = installed.script(source, SLIME_RELOADABLE_PG="1", SLIME_RELOADABLE_PG_MODE="fastest")
    # Every line, whatever says it (a stderr line of start-up's, the package's logger).
    lines = [line for line in result["_stderr"].splitlines() if "'fastest'" in line]
    assert len(lines) == 1, result["_stderr"]
    assert result["mode"] == "wrapper"  # what an unknown mode falls back to


def test_start_file_entry_point_resolves_and_activates(installed) -> None:
    source = (
        "import json, os, pkgutil, sys\n"
        f"entry = open({str(installed.purelib / 'reloadpg_autopatch.start')!r}).read().strip()\n"
        "callable_ = pkgutil.resolve_name(entry)\n"
        "os.environ['SLIME_RELOADABLE_PG'] = '1'\n"
        "callable_()\n"
        "import torch.distributed as d\n"
        "print(json.dumps({'entry': entry, "
        "'patched': hasattr(d.all_reduce, '__reloadpg_autopatch__')}))\n"
    )
    result = installed.script(source)  # gate off at start-up: only the entry point activates
    assert result["entry"] == "_reloadpg_autopatch_boot:activate_from_site"
    assert result["patched"]


def test_rebind_and_log_variables(installed, tmp_path) -> None:
    # Imported first, so it is half-imported when torch.distributed finishes and the patch
    # runs: the all_reduce it then binds is ours (distributed_c10d is patched), the one helper
    # left torch's own there, _rank_not_in_group, is torch's. Only the start-up watcher of the
    # variable can rebind that one, when the module finishes: nothing here calls the patch.
    (tmp_path / "myframework").mkdir()
    (tmp_path / "myframework" / "__init__.py").write_text(
        "from torch.distributed.distributed_c10d import _rank_not_in_group, all_reduce\n"
    )
    source = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import myframework, torch.distributed as d\n"
        "print(json.dumps({'all_reduce': myframework.all_reduce is d.all_reduce, "
        "'helper': myframework._rank_not_in_group is d._rank_not_in_group}))"
    )
    result = installed.script(
        source,
        SLIME_RELOADABLE_PG="1",
        SLIME_RELOADABLE_PG_REBIND="megatron,myframework",
        SLIME_RELOADABLE_PG_LOG="info",
    )
    assert result == {"all_reduce": True, "helper": True, "_stderr": result["_stderr"]}
    assert "reloadpg_autopatch INFO: patched" in result["_stderr"]
    assert "reloadpg_autopatch INFO: rebound 1 stale reference" in result["_stderr"]
    unswept = installed.script(source, SLIME_RELOADABLE_PG="1")
    assert unswept["all_reduce"]
    assert not unswept["helper"]  # the control: without the variable, it stays torch's

    bad = installed.script(
        "import json, torch.distributed as d; "
        "print(json.dumps({'patched': hasattr(d.all_reduce, '__reloadpg_autopatch__')}))",
        SLIME_RELOADABLE_PG="1",
        SLIME_RELOADABLE_PG_REBIND="megatron;rm",
        SLIME_RELOADABLE_PG_LOG="LOUD",
    )
    assert bad["patched"]  # a bad option never costs the patch itself
    lines = reported(bad["_stderr"])
    assert len(lines) == 2, bad["_stderr"]
    assert "SLIME_RELOADABLE_PG_LOG='LOUD' is not a log level" in lines[0]
    assert "SLIME_RELOADABLE_PG_REBIND" in lines[1]
    assert "not a module name" in lines[1]


@pytest.mark.startup
def test_import_of_the_package_does_not_import_torch() -> None:
    source = (
        "import sys, reloadpg_autopatch\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", source],
        env=clean_env(),
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.strip() == "[]", proc.stderr


# Linux caps one environment string (NAME=value) at 128 KiB, so this is about the largest
# value an interpreter can be started with.
_HUGE = 131072 - 64


@pytest.mark.startup
@pytest.mark.parametrize(
    ("variables", "lines_expected"),
    [
        ({"SLIME_RELOADABLE_PG": "x" * _HUGE}, 1),
        (
            {
                "SLIME_RELOADABLE_PG": "1",
                "SLIME_RELOADABLE_PG_MODE": "m\n" * (_HUGE // 2),
                "SLIME_RELOADABLE_PG_LOG": "L" * _HUGE,
            },
            2,
        ),
    ],
)
def test_a_huge_value_is_cut_in_its_one_line_report(installed, variables, lines_expected) -> None:
    proc = installed.run("-c", "pass", env=clean_env(**variables))
    assert proc.returncode == 0, proc.stderr
    lines = reported(proc.stderr)
    assert len(lines) == lines_expected, proc.stderr[:2000]
    assert len(proc.stderr) < 400 * lines_expected, proc.stderr[:2000]
    counts = [re.search(r"\.\.\. \((\d+) characters\)", line) for line in lines]
    assert all(c and int(c.group(1)) >= _HUGE - 1 for c in counts), lines


def test_a_huge_rebind_value_is_cut_in_its_one_line_report(installed) -> None:
    proc = installed.run(
        "-c",
        "import torch.distributed",
        env=clean_env(SLIME_RELOADABLE_PG="1", SLIME_RELOADABLE_PG_REBIND="megatron;" * 10000),
    )
    assert proc.returncode == 0, proc.stderr[:2000]
    lines = reported(proc.stderr)
    assert len(lines) == 1, proc.stderr[:2000]
    assert lines[0].startswith("reloadpg_autopatch: SLIME_RELOADABLE_PG_REBIND"), lines
    assert len(lines[0]) < 400, lines[0][:2000]
    assert "... (90000 characters)" in lines[0], lines[0]


@pytest.mark.startup
def test_the_issues_128_kb_gate_value_is_cut_in_the_message() -> None:
    # 131072 characters exactly, as in the issue: too long for an environment string on Linux,
    # so the message is built in this process, by what the start-up line calls.
    import reloadpg_autopatch._startup as bootstrap

    on, problem = bootstrap.gate_verdict("x" * 131072)
    assert on is False
    assert problem is not None
    assert "\n" not in problem
    assert len(problem) < 300, problem[:400]
    assert "'" + "x" * 60 + "'... (131072 characters)" in problem
