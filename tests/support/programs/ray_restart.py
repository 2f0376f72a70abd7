"""Ray driver for the restart test: an actor that Ray restarts (``max_restarts``) meets survivors.

Two training actors, each a Ray worker activated by the gate in its ``runtime_env`` alone, form a
gloo WORLD on the driver's ``TCPStore`` and cycle it. The driver kills one actor
(``ray.kill(actor, no_restart=False)``); Ray restarts it in a fresh process. The survivor ends
its world (``dist.destroy_process_group()``), as a training framework does when a peer is lost,
and every actor starts a new world under a new store prefix and cycles again.

Run with an interpreter whose site-packages holds the package's ``.pth`` and with the tree under
test on ``PYTHONPATH`` (Ray starts its workers with the driver's interpreter and environment).
Prints one JSON line: what every call returned, with the wall clock of each cycle.
"""

from __future__ import annotations

import json
import os
import sys
import time

GATE = {"SLIME_RELOADABLE_PG": "1"}
WORLD_SIZE = 2
VICTIM = 1


class Trainer:
    """One training rank: its world, a group of its own, and destroy/reload cycles."""

    def __init__(self, rank: int, world_size: int, host: str, port: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.host = host
        self.port = port
        self.started = time.time()

    def info(self) -> dict:
        import torch.distributed  # noqa: F401  (the gate patches it as it is imported)

        import reloadpg_autopatch as rpg

        return {
            "pid": os.getpid(),
            "gate": os.environ.get("SLIME_RELOADABLE_PG"),
            "module": rpg.__file__,
            "patched": rpg.is_patched(),
        }

    def init(self, prefix: str, timeout_s: float) -> dict:
        import warnings
        from datetime import timedelta

        import torch.distributed as dist

        import reloadpg_autopatch as rpg

        warnings.simplefilter("ignore", FutureWarning)
        rpg.set_wrap_policy("all")
        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore(
            self.host, self.port, self.world_size, is_master=False, timeout=timedelta(seconds=60)
        )
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(prefix, store),
            rank=self.rank,
            world_size=self.world_size,
            timeout=timeout,
        )
        rpg.register_default_process_group(timeout, accelerator_backends=("gloo",))
        self.pair = dist.new_group(list(range(self.world_size)))
        return {"world": self._sums()}

    def _sums(self) -> list[float]:
        import torch
        import torch.distributed as dist

        out = []
        for group in (None, self.pair):
            t = torch.tensor([self.rank + 1.0])
            dist.all_reduce(t, group=group)
            out.append(t.item())
        return out

    def cycle(self) -> dict:
        import reloadpg_autopatch as rpg

        started = time.monotonic()
        try:
            rpg.destroy_process_groups()
            rpg.reload_process_groups()
            sums = self._sums()
            error = None
        except Exception as exc:
            sums, error = None, f"{type(exc).__name__}: {exc}"
        return {"sums": sums, "error": error, "seconds": time.monotonic() - started}

    def end(self) -> bool:
        import torch.distributed as dist

        dist.destroy_process_group()
        return dist.is_initialized()


def _all(calls: list, timeout: float) -> list:
    import ray

    return ray.get(calls, timeout=timeout)


def main() -> int:
    import ray
    import torch.distributed as dist

    timeout_s = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    server = dist.TCPStore("127.0.0.1", 0, WORLD_SIZE, is_master=True, wait_for_workers=False)
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    report: dict = {"timeout_s": timeout_s}
    try:
        remote = ray.remote(num_cpus=0, max_restarts=1, max_task_retries=0)(Trainer)
        actors = [
            remote.options(runtime_env={"env_vars": GATE}).remote(
                rank, WORLD_SIZE, "127.0.0.1", server.port
            )
            for rank in range(WORLD_SIZE)
        ]
        report["info"] = _all([a.info.remote() for a in actors], 180)
        report["first_init"] = _all([a.init.remote("world-0/", timeout_s) for a in actors], 120)
        report["first_cycles"] = [_all([a.cycle.remote() for a in actors], 120) for _ in range(2)]

        victim = actors[VICTIM]
        ray.kill(victim, no_restart=False)  # Ray restarts it: a fresh process, same rank
        deadline = time.monotonic() + 120
        old_pid = report["info"][VICTIM]["pid"]
        restarted = None
        while time.monotonic() < deadline:
            try:
                restarted = ray.get(victim.info.remote(), timeout=30)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                time.sleep(0.5)
                continue
            if restarted["pid"] != old_pid:
                break
            time.sleep(0.5)
        report["restarted"] = restarted

        # The survivors end the world they shared with the lost actor.
        report["ended"] = _all([a.end.remote() for r, a in enumerate(actors) if r != VICTIM], 60)
        report["second_init"] = _all([a.init.remote("world-1/", timeout_s) for a in actors], 120)
        cycles = []
        for _ in range(3):
            results = _all([a.cycle.remote() for a in actors], 4 * timeout_s + 60)
            cycles.append(results)
            if any(r["error"] for r in results):
                break  # the ranks no longer agree on where they are: stop here
        report["second_cycles"] = cycles
    finally:
        ray.shutdown()
        del server
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
