"""Ray: the gate travels in runtime_env to actors and submitted jobs, and nowhere else."""

from __future__ import annotations

import json

import pytest

from tests.support import PROGRAMS
from tests.support.venv import clean_env

pytestmark = pytest.mark.timeout(420)

DRIVER = PROGRAMS / "ray_driver.py"


@pytest.mark.usefixtures("one_ray_cluster_at_a_time")
def test_runtime_env_reaches_actors_and_jobs_but_not_the_driver(installed, tmp_path) -> None:
    """Over 10 s: a real local Ray cluster starts (its dashboard too, for ``ray job submit``),
    and every actor and the job is a fresh interpreter that imports torch."""
    proc = installed.run(
        str(DRIVER),
        env=clean_env(RAY_USAGE_STATS_ENABLED="0"),
        timeout=400,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])

    on = report["actor_1"]
    assert on["executable"] == str(installed.python)  # workers run the driver's interpreter
    assert on["gate"] == "1"
    assert on["patched"]
    assert on["bindings"] == [True, True, True, True]

    off = report["actor_0"]
    assert off["gate"] == "0"
    assert not off["patched"]
    assert off["bindings"] == [False, False, False, False]

    driver = report["driver"]  # ray.init(runtime_env=...) would not reach it either
    assert driver["gate"] is None
    assert not driver["patched"]

    job = report["job"]
    assert job["returncode"] == 0, job["tail"]
    assert job["probe"] == {"gate": "1", "patched": True, "bindings": [True, True, True, True]}
