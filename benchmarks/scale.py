"""Scale: the store traffic of one destroy + reload at 64 to 4,096 ranks, and the WORLD swap.

Every training step pays one destroy and one reload on every rank, all through one TCPStore.
Ranks are simulated as threads, each with its own TCPStore client (as a real rank has), against
one real server, driving the package's own store rounds (``groups.store.rounds``): the destroy
agreement and the reload agreement, each rank publishing the names of the ~20 groups it holds in a
Megatron layout. A counting wrapper around each client gives the store operations and bytes.
Each simulated reload also writes the keys gloo's rendezvous would (one per group a rank holds,
past the counter: torch's cost), and each rank deletes its own at the next destroy, as the
package does (``sweep.delete``): rank 0's destroy is reported beside the median rank's. The
deletes run past the clock, which times the rounds. For
contrast, the all-to-all exchange it replaced (every rank reads every entry) runs at the small
sizes. Then real spawned gloo ranks time the temporary WORLD's swap, eager against lazy.

``python -m benchmarks.scale [--quick]`` runs it alone; ``python -m benchmarks`` includes it.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.stats import Row, summarize, table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SIZES = (64, 256, 1024, 4096)
QUICK_SIZES = (64, 256, 1024)
BASELINE_SIZES = (64, 256)
SWAP_SIZES = (2, 4, 8, 16)
TIME_TARGET_S = 2.0
#: What the last arriver of a round adds: it reads the entries, publishes the result and deletes
#: the round's two keys and the previous round's result (``rounds._round``).
LAST_ARRIVER_OPS = 5
SLOPE_TARGET = 1.1


class Counted:
    """A store client that counts its operations and the bytes it sends and receives."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.ops = 0
        self.sent = 0
        self.received = 0
        #: Deletes of the keys this rank's creations wrote (``sweep.delete``).
        self.own_deletes = 0

    def set(self, key: str, value: bytes | str) -> None:
        self.ops += 1
        self.sent += len(key) + len(value)
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        self.ops += 1
        value = self.inner.get(key)
        self.sent += len(key)
        self.received += len(value)
        return value

    def add(self, key: str, amount: int) -> int:
        self.ops += 1
        self.sent += len(key) + 8
        self.received += 8
        return self.inner.add(key, amount)

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        self.ops += 1
        self.sent += sum(len(k) for k in keys)
        self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        self.ops += 1
        self.sent += sum(len(k) for k in keys)
        return self.inner.check(keys)

    def append(self, key: str, value: bytes) -> None:
        self.ops += 1
        self.sent += len(key) + len(value)
        self.inner.append(key, value)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        self.ops += 1
        value = self.inner.compare_set(key, expected, desired)
        self.sent += len(key) + len(expected) + len(desired)
        self.received += len(value)
        return value

    def delete_key(self, key: str) -> bool:
        self.ops += 1
        self.sent += len(key)
        self.received += 1
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        return self.inner.num_keys()

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.ops += 1
        values = self.inner.multi_get(keys)
        self.sent += sum(len(k) for k in keys)
        self.received += sum(len(v) for v in values)
        return values


def megatron_names(rank: int, world_size: int) -> list[str]:
    """The names of the ~20 groups a rank holds in a Megatron layout (TP 8, PP 4, DP N/32).

    Every rank creates every group, in one order, and torch names them with a counter: a kind
    of group of size ``s`` takes ``N / s`` consecutive names, and a rank holds one of them.
    """
    dp = max(world_size // 32, 1)
    sizes = (dp, dp, 8, 4, 32, 2, 1, 1, 8, 8, 1, 8, dp, 8, 32, 8 * dp, 8 * dp, 32, 8, world_size)
    names, offset = [], 1  # name 0 is WORLD
    for size in (min(s, world_size) for s in sizes):
        names.append(str(offset + rank // size))
        offset += world_size // size
    return names


def _payload(rank: int, world_size: int) -> str:
    """What a rank publishes at the reload's agreement: the groups it holds (and is ready)."""
    held = megatron_names(rank, world_size)
    return json.dumps(
        {"held": held, "in_place": [], "released_in_place": [], "takes_part": False, "short": []}
    )


def _answers(rank: int, world_size: int) -> str:
    """What a rank publishes at the destroy's agreement in suspend mode: every group it holds
    answered ``memory_stats()``, so every group's name is in ``ok``."""
    names = megatron_names(rank, world_size)
    return json.dumps(
        {"ok": names, "uninitialized": [], "unsupported": [], "released": [], "why": []}
    )


def _all_to_all(store: Any, key: str, rank: int, world_size: int, payload: str) -> list[bytes]:
    """The exchange the rendezvous replaced: publish, barrier, read every rank's entry."""
    from reloadpg_autopatch.groups.store import rounds

    store.set(f"{key}/{rank}", payload)
    rounds.sync(store, f"{key}/sync", rank, world_size, timeout=600, step="baseline")
    return store.multi_get([f"{key}/{r}" for r in range(world_size)])


#: Rank threads per process. A real rank is a process of its own; thousands of threads in one
#: interpreter queue for its lock each time the store wakes them (4,096 in one process spent
#: 5 to 28 s per cycle here, mostly in the kernel), which is the simulation's cost, not the
#: rendezvous's. So the ranks are spread over processes of at most this many threads each,
#: every one with its own client of the one server.
THREADS_PER_PROCESS = 256

#: Connect parallelism per process. Connecting is not timed.
CONNECTORS = 64

#: torch formats every client socket's address with a reverse name lookup, and reaches the
#: IPv4 server through an IPv4-mapped IPv6 address (``::ffff:127.0.0.1``), which no hosts file
#: names: each connect asks DNS. Where DNS drops queries under load (this machine), a dropped
#: one stalls a connect for the resolver's timeout (5 s, and 227 of 256 parallel connects
#: stalled); a 1 s timeout and one attempt bound that. Connecting is not timed either way.
RESOLVER = {"RES_OPTIONS": "timeout:1 attempts:1"}


def _shard(job: tuple[int, int, range, int, str], start: Any, results: Any) -> None:
    """Ranks ``ranks`` as threads of this process; every process starts each cycle together."""
    port, world_size, ranks, reps, variant = job
    import torch.distributed as dist

    from reloadpg_autopatch.groups import agreement
    from reloadpg_autopatch.groups.store import rounds, sweep

    timeout = datetime.timedelta(seconds=600)

    def connect(_: int) -> Counted:
        return Counted(dist.TCPStore("127.0.0.1", port, 1, is_master=False, timeout=timeout))

    with ThreadPoolExecutor(min(CONNECTORS, len(ranks))) as pool:
        clients = list(pool.map(connect, ranks))
    starts: list[float] = []

    def begin() -> None:  # one thread per process, once its ranks are all connected and here
        start.wait()  # every process: the clock starts once all N ranks are connected
        starts.append(time.perf_counter())

    ends = [[0.0] * len(ranks) for _ in range(reps)]
    #: Each rank's last destroy: store operations, bytes, deletes (the package's own work).
    destroys: list[tuple[float, float, float]] = [(0.0, 0.0, 0.0)] * len(ranks)
    answers: list[set[str]] = [set() for _ in range(reps)]
    errors: list[str] = []
    barrier = threading.Barrier(len(ranks), action=begin)

    def rank_body(index: int) -> None:
        rank, store = ranks[index], clients[index]
        payload, answers_payload = _payload(rank, world_size), _answers(rank, world_size)
        previous = None
        wrote: list[str] = []  # the creation keys this rank's groups wrote in the cycle before
        try:
            for rep in range(reps):
                barrier.wait()
                # The keys ``process.ProcessState.key`` gives a cycle's destroy and reload, and
                # the package's two rounds as it runs them (each deleting its predecessor's
                # result); in suspend mode the destroy's round carries every group's answer.
                destroy = f"reloadpg_autopatch/{rep + 1}/0/agreement"
                reload = f"reloadpg_autopatch/{rep + 1}/1/agreement"
                if variant == "rendezvous":
                    before = (store.ops, store.sent + store.received)
                    rounds.agree(
                        store,
                        destroy,
                        rank,
                        world_size,
                        answers_payload,
                        merge=agreement.merge_name_sets,
                        timeout=600,
                        step="destroy: agreement",
                        previous=previous,
                        token=True,
                    )
                    agreed = (store.ops - before[0], store.sent + store.received - before[1])
                    _token, answer = rounds.agree(
                        store,
                        reload,
                        rank,
                        world_size,
                        payload,
                        merge=agreement.merge_name_sets,
                        timeout=600,
                        step="reload: agreement",
                        previous=rounds.done_key(destroy),
                        token=True,
                    )
                    previous = rounds.done_key(reload)
                else:
                    rounds.sync(store, destroy, rank, world_size, timeout=600, step="destroy")
                    answer = b"".join(_all_to_all(store, reload, rank, world_size, payload))
                ends[rep][index] = time.perf_counter()
                answers[rep].add(hashlib.sha256(answer).hexdigest())
                if variant == "rendezvous":
                    # What this rank's creations of the cycle before wrote, its own to delete
                    # after the destroy's agreement: counted with its destroy, but past the
                    # clock (4,096 ranks' deletes, every one a thread's wake-up on 2 cores,
                    # would time the simulation; a rank's own are 20 round trips).
                    deleted = (store.ops, store.sent + store.received)
                    for key in wrote:
                        sweep.delete(store, key)
                    store.own_deletes += len(wrote)
                    destroys[index] = (
                        agreed[0] + store.ops - deleted[0],
                        agreed[1] + store.sent + store.received - deleted[1],
                        len(wrote),
                    )
                    # The reload creates the rank's groups again: gloo publishes one address
                    # per group and member (torch's cost: past the counter and the clock).
                    wrote = [
                        f"{reload}/groups/{name}//cpu//0/{rank}"
                        for name in megatron_names(rank, world_size)
                    ]
                    for key in wrote:
                        store.inner.set(key, b"127.0.0.1:29500/" + bytes(16))
        except BaseException as error:  # reported by the parent
            errors.append(repr(error))
            barrier.abort()

    threading.stack_size(256 * 1024)
    threads = [threading.Thread(target=rank_body, args=(i,)) for i in range(len(ranks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put(
        {
            "errors": errors,
            "starts": starts,
            "ends": [max(e) for e in ends],
            "answers": [sorted(a) for a in answers],
            "ops": [(c.ops - c.own_deletes) / reps for c in clients],
            "moved": [(c.sent + c.received) / reps for c in clients],
            "destroys": {rank: destroys[i] for i, rank in enumerate(ranks)},
        }
    )


def threads_point(world_size: int, reps: int, variant: str) -> dict[str, Any]:
    """One size: ``reps`` cycles of destroy barrier + reload agreement on ``world_size`` ranks.

    The store server lives in this process (as in rank 0's); the ranks are threads of other
    processes, at most ``THREADS_PER_PROCESS`` to a process, each with its own client.
    """
    import multiprocessing as mp

    import torch.distributed as dist

    os.environ.update(RESOLVER)  # before any child starts: they inherit it
    server = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    count = max(1, math.ceil(world_size / THREADS_PER_PROCESS))
    size = math.ceil(world_size / count)
    shards = [range(at, min(at + size, world_size)) for at in range(0, world_size, size)]
    # Forked from one server that imported torch once: a child starts in milliseconds.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch.distributed", "reloadpg_autopatch.groups.store.rounds"])
    start, results = ctx.Barrier(len(shards)), ctx.Queue()
    procs = [
        ctx.Process(
            target=_shard, args=((server.port, world_size, shard, reps, variant), start, results)
        )
        for shard in shards
    ]
    for proc in procs:
        proc.start()
    parts = [results.get(timeout=1800) for _ in procs]
    for proc in procs:
        proc.join()
    errors = [e for part in parts for e in part["errors"]]
    if errors:
        raise RuntimeError(f"{len(errors)} ranks failed, the first: {errors[0]}")
    seconds = [
        max(part["ends"][rep] for part in parts) - min(part["starts"][rep] for part in parts)
        for rep in range(reps)
    ]
    ops = sorted(o for part in parts for o in part["ops"])
    moved = sorted(m for part in parts for m in part["moved"])
    answers = [{a for part in parts for a in part["answers"][rep]} for rep in range(reps)]
    destroys = {int(r): d for part in parts for r, d in part["destroys"].items()}
    others = sorted(d for r, d in destroys.items() if r != 0)
    del server
    return {
        "world_size": world_size,
        "variant": variant,
        "seconds": summarize(seconds).as_dict(),
        "samples": seconds,
        "same_answer_everywhere": all(len(a) == 1 for a in answers),
        "payload_bytes": len(_payload(0, world_size)),
        "ops_per_rank": {"median": ops[len(ops) // 2], "max": ops[-1]},
        "bytes_per_rank": {"median": moved[len(moved) // 2], "max": moved[-1]},
        "ops_total": sum(ops),
        "rank0_destroy": dict(
            zip(("ops", "bytes", "deletes"), destroys.get(0, (0, 0, 0)), strict=True)
        ),
        "median_destroy": dict(
            zip(
                ("ops", "bytes", "deletes"),
                others[len(others) // 2] if others else (0, 0, 0),
                strict=True,
            )
        ),
        "groups_per_rank": len(megatron_names(0, world_size)),
        "bytes_total": sum(moved),
        "processes": len(shards),
        "threads_per_process": size,
    }


def fit_slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of log(time) against log(N)."""
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


_POINT = (sys.executable, "-W", "ignore", "-m", "benchmarks.scale", "--point")


def _threads_child(sizes: tuple[int, ...], reps: int, variant: str) -> list[dict[str, Any]]:
    """Each size in a fresh interpreter: thousands of threads and sockets, then gone."""
    out = []
    for n in sizes:
        proc = subprocess.run(
            [*_POINT, str(n), "--reps", str(reps), "--variant", variant],
            cwd=str(ROOT),
            capture_output=True,
            text=True,
            check=False,
            timeout=1800,
        )
        if proc.returncode != 0:
            out.append({"world_size": n, "variant": variant, "error": proc.stderr[-2000:]})
            continue
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


def swap_points(sizes: tuple[int, ...], reps: int) -> dict[int, dict[str, Any]]:
    """The temporary WORLD's swap on real gloo ranks: eager against lazy, per world size.

    Per repetition: the slowest rank's wall time (of the whole destroy, and of creating the
    temporary WORLD), the median rank's, and the most CPU time and sockets any rank spent
    creating it. On a machine with fewer cores than ranks, the slowest rank's wall time also
    counts the other ranks' CPU (they run at once); the CPU time and the sockets do not.
    """
    import statistics

    from reloadpg_autopatch.tools import launch

    command = [sys.executable, "-m", "benchmarks._swap_rank", "--reps", str(reps)]
    out = {}
    for n in sizes:
        outcomes = launch.launch(command, n, timeout=900, cwd=str(ROOT))
        samples: dict[tuple[str, int], list[dict[str, float]]] = {}
        for outcome in outcomes:
            for event in outcome.events:
                if event["type"] == "time":
                    samples.setdefault((event["variant"], event["rep"]), []).append(event)
        per: dict[str, list[float]] = {}
        for (variant, _), events in sorted(samples.items()):
            for field, name, pick in (
                ("ms", "", max),
                ("create_ms", " create", max),
                ("create_ms", " create median rank", statistics.median),
                ("create_cpu_ms", " create cpu", max),
                ("create_sockets", " create sockets", max),
            ):
                per.setdefault(variant + name, []).append(pick(e[field] for e in events))
        out[n] = {name: summarize(values).as_dict() for name, values in per.items()}
    return out


def _mb(value: float) -> str:
    return f"{value / 1e6:.2f} MB" if value >= 1e6 else f"{value / 1e3:.1f} kB"


def rows_of(raw: dict[str, Any]) -> list[Row]:
    rows = []
    ours = [p for p in raw["threads"] if "error" not in p]
    for point in raw["threads"] + raw["baseline"]:
        label = "rendezvous" if point["variant"] == "rendezvous" else "all-to-all (before)"
        if "error" in point:
            rows.append(
                Row("scale", f"{label}, {point['world_size']} ranks", "did not run", "-", False)
            )
            continue
        s = point["seconds"]
        ok = None
        target = "-"
        if point["variant"] == "rendezvous" and point["world_size"] == max(SIZES):
            ok, target = s["median"] <= TIME_TARGET_S, f"<= {TIME_TARGET_S:.0f} s"
        rows.append(
            Row(
                "scale",
                f"{label}, {point['world_size']} thread ranks: destroy + reload agreements",
                f"{s['median'] * 1e3:.0f} ms [{s['p25'] * 1e3:.0f}-{s['p75'] * 1e3:.0f}]; per rank "
                f"{point['ops_per_rank']['median']:.0f} ops (max {point['ops_per_rank']['max']:.0f}"
                f"), {_mb(point['bytes_per_rank']['median'])} (max "
                f"{_mb(point['bytes_per_rank']['max'])}); total {point['ops_total']:.0f} ops, "
                f"{_mb(point['bytes_total'])}; same answer: {point['same_answer_everywhere']}",
                target,
                ok,
            )
        )
    for point in ours:
        if "rank0_destroy" not in point:
            continue
        zero, median = point["rank0_destroy"], point["median_destroy"]
        groups = point["groups_per_rank"]
        rows.append(
            Row(
                "scale",
                f"rank 0's destroy, {point['world_size']} thread ranks x {groups} groups: store "
                "operations (its own deletes), bytes; the median rank's",
                f"rank 0 {zero['ops']:.0f} ops ({zero['deletes']:.0f} deletes), "
                f"{_mb(zero['bytes'])}; median rank {median['ops']:.0f} ops "
                f"({median['deletes']:.0f} deletes), {_mb(median['bytes'])}",
                f"as any rank's (+ up to {LAST_ARRIVER_OPS} as the round's last arriver), "
                f"deleting its own {groups} keys",
                zero["ops"] <= median["ops"] + LAST_ARRIVER_OPS and zero["deletes"] == groups,
            )
        )
    if len(ours) >= 2:
        slope = fit_slope([(p["world_size"], p["seconds"]["median"]) for p in ours])
        raw["slope"] = slope
        sizes = ", ".join(str(p["world_size"]) for p in ours)
        rows.append(
            Row(
                "scale",
                f"log-log slope of time against N ({sizes})",
                f"{slope:.2f}",
                f"<= {SLOPE_TARGET}",
                slope <= SLOPE_TARGET,
            )
        )
    for n, point in raw.get("swap", {}).items():
        for suffix, what, unit in (
            (" create", "creating the temporary WORLD, slowest rank", "ms"),
            (" create median rank", "creating the temporary WORLD, median rank", "ms"),
            (" create cpu", "creating the temporary WORLD, CPU time (most of any rank)", "ms"),
            (" create sockets", "creating the temporary WORLD, sockets opened per rank", ""),
            ("", "whole destroy, slowest rank", "ms"),
        ):
            eager, lazy = point.get("eager" + suffix), point.get("lazy" + suffix)
            if eager is None or lazy is None:
                continue
            rows.append(
                Row(
                    "scale",
                    f"WORLD swap, {n} gloo ranks, {what}: lazy vs eager",
                    f"lazy {lazy['median']:.1f}{unit} [{lazy['p25']:.1f}-{lazy['p75']:.1f}] vs "
                    f"eager {eager['median']:.1f}{unit} [{eager['p25']:.1f}-{eager['p75']:.1f}]",
                    "-",
                    None,
                )
            )
    return rows


def draw(raw: dict[str, Any], path: Path, title: str) -> None:
    """Time per cycle against N on log-log axes, with the fitted slope."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(6.4, 4.4))
    for key, name, color in (
        ("threads", "rendezvous (last arriver merges)", "#1f77b4"),
        ("baseline", "all-to-all (before)", "#d62728"),
    ):
        label = name
        points = [p for p in raw[key] if "error" not in p]
        if not points:
            continue
        xs = [p["world_size"] for p in points]
        ys = [p["seconds"]["median"] for p in points]
        low = [y - p["seconds"]["p25"] for y, p in zip(ys, points, strict=True)]
        high = [p["seconds"]["p75"] - y for y, p in zip(ys, points, strict=True)]
        if len(points) >= 2:
            label += f", slope {fit_slope(list(zip(xs, ys, strict=True))):.2f}"
        axis.errorbar(xs, ys, yerr=[low, high], marker="o", color=color, label=label, capsize=3)
    axis.axhline(TIME_TARGET_S, color="#444444", linestyle="--", linewidth=1)
    axis.annotate(f"{TIME_TARGET_S:.0f} s target", (64, TIME_TARGET_S), fontsize=8, va="bottom")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("ranks (threads, one TCPStore client each, one server)")
    axis.set_ylabel("destroy + reload agreements, s (median)")
    axis.legend(fontsize=8)
    axis.grid(True, which="both", alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(quick: bool = False) -> tuple[list[Row], dict[str, Any]]:
    reps = 3 if quick else 5
    raw: dict[str, Any] = {
        "threads": _threads_child(QUICK_SIZES if quick else SIZES, reps, "rendezvous"),
        "baseline": _threads_child(BASELINE_SIZES, reps, "all-to-all"),
    }
    raw["swap"] = swap_points(SWAP_SIZES[:3] if quick else SWAP_SIZES, reps)
    return rows_of(raw), raw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    parser.add_argument("--no-save", action="store_true", help="print only, write no results")
    parser.add_argument("--point", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=5, help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="rendezvous", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.point:
        print(json.dumps(threads_point(args.point, args.reps, args.variant)))
        return 0
    import torch

    started = time.monotonic()
    rows, raw = run(quick=args.quick)
    print(table(rows))
    print(f"\n{len(rows)} rows; {time.monotonic() - started:.0f} s in all")
    if args.no_save:
        return 0
    save(raw, rows, torch.__version__, quick=args.quick)
    return 0


def save(raw: dict[str, Any], rows: list[Row], torch_version: str, quick: bool) -> Path:
    """Write ``results/<date>-<torch>-scale.json`` and ``results/scale.png``."""
    today = datetime.date.today().isoformat()
    RESULTS.mkdir(exist_ok=True)
    meta = {
        "date": today,
        "torch": torch_version,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "quick": quick,
    }
    table_rows = [r.__dict__ | {"verdict": r.verdict} for r in rows]
    target = RESULTS / f"{today}-{torch_version}-scale.json"
    target.write_text(json.dumps({"meta": meta, "table": table_rows, "raw": raw}, indent=2) + "\n")
    draw(raw, RESULTS / "scale.png", f"Store traffic of a cycle, torch {torch_version}, {today}")
    print(f"wrote {target.relative_to(ROOT)} and {(RESULTS / 'scale.png').relative_to(ROOT)}")
    return target


if __name__ == "__main__":
    sys.exit(main())
