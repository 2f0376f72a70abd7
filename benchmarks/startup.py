"""Figure 1: interpreter start-up with and without the package, gate off and on.

Two venvs that differ only by the package: ``bare`` and ``installed`` (the wheel of this
checkout). Both see the benchmark environment's torch through the same path file. Runs are
interleaved case by case so that drift on a shared machine hits every case alike.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path

from benchmarks.stats import Row, Summary, summarize
from tests.support.venv import ROOT, Venv, clean_env, make_venv

# Times the import inside the child (the interpreter's start and torch's slow, noisy exit are
# left out), and, when activation is on, the patch itself: the hook's callback is wrapped.
IMPORT_PROBE = r"""
import json, sys, time
finder = [f for f in sys.meta_path if type(f).__module__ == "_reloadpg_autopatch_boot"]
spent = []
if finder:
    callback = finder[0].callback
    def timed():
        started = time.perf_counter()
        callback()
        spent.append(time.perf_counter() - started)
    finder[0].callback = timed
started = time.perf_counter()
import torch.distributed
elapsed = time.perf_counter() - started
print(json.dumps({"import_ms": elapsed * 1e3, "patch_ms": spent[0] * 1e3 if spent else None}))
"""


def _spawn_ms(venv: Venv, args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([str(venv.python), *args], env=env, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - started) * 1e3


def _import_ms(venv: Venv, args: list[str], env: dict[str, str]) -> dict:
    proc = subprocess.run(
        [str(venv.python), "-c", IMPORT_PROBE], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(proc.stdout)


def _measure(cases: dict[str, tuple[Venv, list[str], dict[str, str]]], runs: int, probe) -> dict:
    samples: dict[str, list] = {name: [] for name in cases}
    names = list(cases)
    for name in names:  # warm the page cache and the bytecode caches
        probe(*cases[name])
    for _ in range(runs):
        random.shuffle(names)
        for name in names:
            samples[name].append(probe(*cases[name]))
    return samples


def run(workdir: Path, quick: bool = False) -> tuple[list[Row], dict]:
    bare = make_venv(workdir / "bare")
    installed = make_venv(workdir / "installed")
    installed.pip("install", "--no-deps", "--quiet", str(ROOT))
    off, on = clean_env(), clean_env(SLIME_RELOADABLE_PG="1")
    bare_env = clean_env(SLIME_RELOADABLE_PG="1")  # no package: the variable does nothing
    starts = _measure(
        {
            "without package": (bare, ["-c", "pass"], bare_env),
            "installed, gate off": (installed, ["-c", "pass"], off),
            "installed, gate on": (installed, ["-c", "pass"], on),
        },
        20 if quick else 200,
        _spawn_ms,
    )
    cheap = {name: summarize(values) for name, values in starts.items()}
    # Paired: the i-th start of each case ran in the same shuffled round, so a difference of
    # two starts of one round leaves out the machine's drift between rounds.
    paired_on = summarize(
        [
            on_ - bare_
            for on_, bare_ in zip(
                starts["installed, gate on"], starts["without package"], strict=True
            )
        ]
    )
    imports = _measure(
        {
            "import torch.distributed, without package": (bare, [], bare_env),
            "import torch.distributed, gate on": (installed, [], on),
        },
        6 if quick else 20,
        _import_ms,
    )
    heavy = {name: summarize([s["import_ms"] for s in runs]) for name, runs in imports.items()}
    patch_ms = summarize([s["patch_ms"] for s in imports["import torch.distributed, gate on"]])
    base = cheap["without package"]
    off_delta = cheap["installed, gate off"].median - base.median
    off_ratio = cheap["installed, gate off"].median / base.median
    on_delta = paired_on.median
    t_base = heavy["import torch.distributed, without package"]
    t_on = heavy["import torch.distributed, gate on"]
    ratio = t_on.median / t_base.median - 1

    def ms(s: Summary) -> str:
        return f"{s.median:.1f} ms [{s.p25:.1f}-{s.p75:.1f}]"

    rows = [
        Row("start-up", "python -c pass, without package", ms(base), "baseline", None),
        Row(
            "start-up",
            "installed, gate off",
            f"{ms(cheap['installed, gate off'])} ({off_delta:+.2f} ms, {off_ratio:.3f}x)",
            "at most 1.03x the start without the package",
            off_ratio <= 1.03,
        ),
        Row(
            "start-up",
            f"installed, gate on, no torch (paired, {len(starts['without package'])} rounds)",
            f"{ms(cheap['installed, gate on'])} ({on_delta:+.2f} ms "
            f"[{paired_on.p25:+.2f}..{paired_on.p75:+.2f}])",
            "at most +1 ms over the start without the package",
            on_delta <= 1.0,
        ),
        Row("start-up", "import torch.distributed, without", ms(t_base), "baseline", None),
        Row(
            "start-up",
            "import torch.distributed, gate on",
            f"{ms(t_on)} ({ratio:+.1%})",
            "within 2%",
            ratio <= 0.02,
        ),
        Row(
            "start-up",
            "  of which the patch (hook callback)",
            f"{patch_ms.median:.1f} ms [{patch_ms.p25:.1f}-{patch_ms.p75:.1f}] "
            f"({patch_ms.median / t_base.median:.1%} of the import)",
            "-",
            None,
        ),
    ]
    raw = {name: s.as_dict() for name, s in {**cheap, **heavy}.items()}
    raw["deltas_ms"] = {"gate_off": off_delta, "gate_on": on_delta}
    raw["gate_on_paired_ms"] = paired_on.as_dict()
    raw["gate_off_ratio"] = off_ratio
    raw["torch_import_ratio"] = ratio
    raw["patch_ms"] = patch_ms.as_dict()
    return rows, raw


if __name__ == "__main__":
    import sys
    import tempfile

    from benchmarks.stats import table

    with tempfile.TemporaryDirectory() as workdir:
        rows, raw = run(Path(workdir), quick="--quick" in sys.argv)
    print(table(rows))
    print(json.dumps(raw, indent=1))
