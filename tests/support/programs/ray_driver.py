"""Ray driver for the tests: actors configured only through runtime_env, and a submitted job.

Run with the interpreter of a venv where the package is installed: Ray starts its workers
with the driver's interpreter, so they process that venv's .pth. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

PROBE_TAG = "RELOADPG_PROBE "


def probe() -> dict:
    """What a training process sees: Megatron's bindings and torch.distributed."""
    import torch.distributed as dist
    from megatron.core.distributed import param_and_grad_buffer as buffer
    from megatron.core.tensor_parallel import mappings

    return {
        "gate": os.environ.get("SLIME_RELOADABLE_PG"),
        "executable": sys.executable,
        "patched": hasattr(dist.all_gather_into_tensor, "__reloadpg_autopatch__"),
        "bindings": [
            hasattr(f, "__reloadpg_autopatch__")
            for f in (
                mappings.dist_all_gather_func,
                mappings.dist_reduce_scatter_func,
                buffer.dist_all_gather_func,
                buffer._coalescing_manager,
            )
        ],
    }


class Probe:
    """The actor: reports what it sees from inside its worker process."""

    def report(self) -> dict:
        return probe()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    if sys.argv[1:] == ["--probe"]:  # the submitted job's entrypoint
        report = probe()
        del report["executable"]
        print(PROBE_TAG + json.dumps(report))
        return 0
    import ray

    dashboard = _free_port()
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=dashboard,
        log_to_driver=False,
    )
    report: dict = {}
    try:
        actor_class = ray.remote(num_cpus=0)(Probe)
        for gate in ("1", "0"):
            actor = actor_class.options(runtime_env={"env_vars": {"SLIME_RELOADABLE_PG": gate}})
            handle = actor.remote()
            report[f"actor_{gate}"] = ray.get(handle.report.remote(), timeout=180)
            ray.kill(handle)
        report["driver"] = probe()
        job = subprocess.run(
            [
                sys.executable,
                "-m",
                "ray.scripts.scripts",
                "job",
                "submit",
                "--address",
                f"http://127.0.0.1:{dashboard}",
                "--runtime-env-json",
                json.dumps({"env_vars": {"SLIME_RELOADABLE_PG": "1"}}),
                "--",
                sys.executable,
                os.path.abspath(__file__),
                "--probe",
            ],
            capture_output=True,
            text=True,
            timeout=240,
        )
        lines = [line for line in job.stdout.splitlines() if line.startswith(PROBE_TAG)]
        report["job"] = {
            "returncode": job.returncode,
            "probe": json.loads(lines[-1][len(PROBE_TAG) :]) if lines else None,
            "tail": (job.stdout + job.stderr)[-2000:],
        }
    finally:
        ray.shutdown()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
