"""Promises from the docs that a mutation pass broke without any test noticing (issue 24).

One test per promise (or per part of one), each with an oracle outside the package: a real
``TCPStore`` server's own ``list_keys()`` and ``num_keys()``, a store wrapper that logs every
operation a rank makes, Python's ``any()``, ``gc.callbacks`` with automatic collection off, a
memory probe whose figures the test chooses and whose calls it counts, PEP 678 ``__notes__``,
the exit status and output of the package's own CLI run as a subprocess, the interpreter's
``sys.meta_path``, object identity, the wall clock, and what torch's ``init_process_group``
receives (a spy in the rank).

Every rank runs on real gloo (``tests/support/ranks.py``); where the gate matters it is the gate
that patched it. Ranks and subprocesses import the package from this tree (``ROOT``), and the
ranks check that they did: run the suite with this tree first on ``PYTHONPATH``.

A Python ``Store`` subclass cannot observe deletes: torch's ``PrefixStore`` over one raises
"pure virtual function deleteKey" (torch 2.13 and 2.14), so key counts are read from a real
server instead.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from tests.support import ROOT, memory_probes, this_tree
from tests.support.ranks import GATE, HOST, Rank, run_ranks, total

pytestmark = pytest.mark.timeout(300)

GiB = 2**30
MiB = 2**20


def _logging_store(inner: Any) -> Any:
    """A ``torch.distributed.Store`` forwarding to ``inner`` and logging ``(operation, key)``."""
    import torch.distributed as dist

    class Logging(dist.Store):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[tuple[str, str]] = []

        def _log(self, op: str, *keys: str) -> None:
            self.ops.extend((op, key) for key in keys)

        def set(self, key, value):
            self._log("set", key)
            inner.set(key, value)

        def get(self, key):
            self._log("get", key)
            return inner.get(key)

        def add(self, key, value):
            self._log("add", key)
            return inner.add(key, value)

        def compare_set(self, key, expected, desired):
            self._log("compare_set", key)
            return inner.compare_set(key, expected, desired)

        def wait(self, keys, timeout=None):
            self._log("wait", *keys)
            return inner.wait(keys) if timeout is None else inner.wait(keys, timeout)

        def check(self, keys):
            self._log("check", *keys)
            return inner.check(keys)

        def multi_get(self, keys):
            self._log("multi_get", *keys)
            return inner.multi_get(keys)

        def multi_set(self, keys, values):
            self._log("multi_set", *keys)
            inner.multi_set(keys, values)

        def delete_key(self, key):
            self._log("delete_key", key)
            return inner.delete_key(key)

        def num_keys(self):
            return inner.num_keys()

        def append(self, key, value):
            self._log("append", key)
            inner.append(key, value)

        def has_extended_api(self):
            return True

    return Logging()


# ---- 1. the keys of a store round go with the round -------------------------------------------

#: A key of the package's rendezvous: ``reloadpg_autopatch/<cycle>/<step>/<kind>/...``. Under
#: ``groups`` and ``world`` it is torch creating groups (gloo's own keys, never deleted by torch).
_KEY = re.compile(r"reloadpg_autopatch/\d+/\d+/([^/]+)/")


def _is_round_key(key: str) -> bool:
    found = _KEY.search(key)
    return found is not None and found[1] not in ("groups", "world")


def _keys_over_cycles(ctx: Rank) -> dict:
    rpg, dist = this_tree.begin(ctx, world=True)
    # The launcher's server, as its own client sees it: ``list_keys()`` is the server's answer.
    server = dist.TCPStore(
        HOST, ctx.port, ctx.world_size, is_master=False, timeout=this_tree.TIMEOUT
    )
    pair, spare = dist.new_group([0, 1]), dist.new_group([0, 1])
    dist.barrier()
    rounds, torchs, sums = [], [], []
    for cycle in range(8):
        if cycle == 3 and ctx.rank == 1:
            dist.destroy_process_group(spare)  # from now on every reload has a created sync
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
        sums.append(total(pair, 1.0))
        dist.barrier()  # every rank has returned from the reload: every round is over
        keys = server.list_keys()
        rounds.append(sorted(k for k in keys if _is_round_key(k)))
        torchs.append(len(keys) - len(rounds[-1]))
        dist.barrier()  # nobody starts the next round before rank 0 has counted
    dist.destroy_process_group()
    return {"rounds": rounds, "torchs": torchs, "sums": sums}


@pytest.mark.timeout(240)
def test_p1_store_key_count_stays_flat_over_destroy_reload_cycles_of_real_ranks() -> None:
    """The server holds as many of the package's round keys after the eighth cycle as after
    the first (each round's keys are deleted by its last reader), and torch's own keys for
    the groups it creates do not grow either (swept at the next cycle's first round; before
    that sweep they grew every cycle, which this oracle saw)."""
    reports = run_ranks(_keys_over_cycles, 2, timeout=200, env=GATE)
    counts = [len(keys) for keys in reports[0]["rounds"]]
    torchs = reports[0]["torchs"]
    assert all(r["sums"] == [2.0] * 8 for r in reports), reports
    assert counts == [counts[0]] * len(counts), ("the rounds' keys pile up", reports[0]["rounds"])
    # One key: the last round's result, which the next round's last arriver deletes.
    assert counts[0] == 1, reports[0]["rounds"]
    assert max(torchs[1:]) <= torchs[1], torchs


def _rounds_body(port: int, n: int, rounds: int, line: threading.Barrier, out: dict) -> Any:
    """Rank bodies driving the package's rendezvous rounds as the lifecycle chains them."""
    import torch.distributed as dist

    from reloadpg_autopatch.groups.store import rounds

    def body(rank: int) -> list[bytes]:
        store = dist.TCPStore(HOST, port, 1, is_master=False, timeout=timedelta(seconds=30))
        answers = []
        previous = None
        for i in range(rounds):
            key = f"reloadpg_autopatch/{i + 1}/0/sync/point"
            rounds.sync(store, key, rank, n, timeout=20, step="p1 sync", previous=previous)
            previous = rounds.done_key(key)
            key = f"reloadpg_autopatch/{i + 1}/1/agreement"
            _token, merged = rounds.agree(
                store,
                key,
                rank,
                n,
                f"{rank}",
                merge=b",".join,
                timeout=20,
                step="p1 agree",
                previous=previous,
                token=True,
            )
            previous = rounds.done_key(key)
            handles = rounds.exchange(
                store,
                f"reloadpg_autopatch/{i + 1}/1/handles",
                rank,
                n,
                bytes([rank]) * 3,
                timeout=20,
                step="p1 exchange",
            )
            answers.append(merged + b"|" + b"".join(handles))
            line.wait(20)  # every rank has finished the round
            if rank == 0:
                out.setdefault("counts", []).append(store.num_keys())
            line.wait(20)  # counted before anybody starts the next round
        return answers

    return body


@pytest.mark.timeout(120)
def test_p1_store_key_count_stays_flat_over_many_rounds_driven_by_threads() -> None:
    """``sync``, ``agree`` (with the previous round's result to delete) and ``exchange``, 15
    times over on 4 thread ranks against one real server: its key count never grows."""
    import torch.distributed as dist

    server = dist.TCPStore(HOST, 0, 1, is_master=True, wait_for_workers=False)
    n, rounds = 4, 15
    line = threading.Barrier(n)
    out: dict[str, list[int]] = {}
    body = _rounds_body(server.port, n, rounds, line, out)
    results: dict[int, Any] = {}

    def run(rank: int) -> None:
        try:
            results[rank] = body(rank)
        except BaseException as error:  # the test looks at it
            results[rank] = error
            line.abort()

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert not any(t.is_alive() for t in threads), "a thread rank hung"
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    want = b"0,1,2,3|" + b"".join(bytes([r]) * 3 for r in range(n))
    assert all(r == [want] * rounds for r in results.values()), results
    counts = out["counts"]
    assert len(counts) == rounds
    assert counts == [counts[0]] * rounds, f"keys left behind by the rounds: {counts}"
    assert server.num_keys() == counts[0]


# ---- 2. yes/no fields merge as "any rank says so"; a release on one rank still syncs ----------


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_p2_merge_name_sets_booleans_are_true_if_any_rank_says_so(n: int) -> None:
    from reloadpg_autopatch.groups import agreement

    def entries(flags: list[bool]) -> list[bytes]:
        return [
            json.dumps({"held": [str(r)], "takes_part": flag, "short": []}).encode()
            for r, flag in enumerate(flags)
        ]

    cases = [[False] * n] + [[r == yes for r in range(n)] for yes in range(n)]
    cases.append([True] * n)
    for flags in cases:
        merged = agreement.expand_name_sets(agreement.merge_name_sets(entries(flags)))
        assert merged["takes_part"] is any(flags), (flags, merged)
        assert sorted(merged["held"]) == sorted(str(r) for r in range(n)), (flags, merged)


def _released_on_rank_1(ctx: Rank) -> dict:
    import torch.distributed as dist

    rpg = this_tree.package()
    assert rpg.is_patched()
    rpg.set_wrap_policy("all")
    inner = dist.TCPStore(
        HOST, ctx.port, ctx.world_size, is_master=False, timeout=this_tree.TIMEOUT
    )
    store = _logging_store(inner)
    dist.init_process_group(
        "gloo", store=store, rank=ctx.rank, world_size=ctx.world_size, timeout=this_tree.TIMEOUT
    )
    everyone = dist.new_group(list(range(ctx.world_size)))

    def created_sync_ops(start: int) -> list[str]:
        return [op for op, key in store.ops[start:] if "/sync/created/" in key]

    start = len(store.ops)
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    before = created_sync_ops(start)
    if ctx.rank == 1:
        dist.destroy_process_group(everyone)  # released here; the other ranks still hold it
    start = len(store.ops)
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    after = created_sync_ops(start)
    dist.destroy_process_group()
    return {"before": before, "after": after}


@pytest.mark.timeout(240)
def test_p2_a_group_released_on_one_rank_still_gets_the_created_sync_on_every_rank() -> None:
    """Rank 1 (in the middle of three) releases the group the others hold: at the next reload
    every rank, also those that released nothing, takes part in the "created" sync (an append,
    an add and a wait on its keys), which no reload had before the release."""
    reports = run_ranks(_released_on_rank_1, 3, timeout=200, env=GATE)
    for rank, report in enumerate(reports):
        assert report["before"] == [], (rank, report)
        assert {"append", "add", "wait"} <= set(report["after"]), (rank, report)


# ---- 3. the memory guard: its boundary, WORLD's stand-in, and the note on our own error --------


def _guard_world(ctx: Rank) -> dict:
    rpg, dist = this_tree.begin(ctx, world=True)
    out: dict[str, Any] = {}
    with memory_probes.GcRuns() as gc_runs:
        probe = memory_probes.EventProbe(gc_runs)
        probe.install()
        rpg.set_memory_guard(2.0)
        a = dist.new_group([0, 1])
        for label, free in (("at", 2 * GiB), ("below", 2 * GiB - 1)):
            probe.free = free
            rpg.destroy_process_groups()
            rpg.reload_process_groups()
            mark = probe.mark()
            sums = [total(a, ctx.rank + 1.0)]
            out[label] = {**probe.since(mark), "sums": sums}

        # WORLD: armed by each reload. Memory is short, so that each check of the guard shows
        # as a clear (the cycle report asks the probe too, but never clears). The first call of
        # any method of an armed group checks, and torch's own new_group calls WORLD's while
        # the reload re-creates the groups: so the count starts with the reload.
        probe.free = 1 * GiB
        reloads = []
        for _cycle in range(2):
            rpg.destroy_process_groups()
            mark = probe.mark()
            rpg.reload_process_groups()
            first = total(None, 1.0)
            after_first = probe.since(mark)["clear"]
            later = [total(None, 1.0) for _ in range(3)]
            reloads.append(
                {"first": after_first, "all": probe.since(mark)["clear"], "sums": [first, *later]}
            )
        out["world_reloads"] = reloads

        # WORLD, settled: no check; with every_call=True chosen now (no reload): every call.
        mark = probe.mark()
        settled = [total(None, 1.0) for _ in range(3)]
        out["world_settled"] = {"clear": probe.since(mark)["clear"], "sums": settled}
        rpg.set_memory_guard(2.0, every_call=True)
        counts = []
        for _ in range(3):
            mark = probe.mark()
            total(None, 1.0)
            counts.append(probe.since(mark)["clear"])
        out["world_every_call"] = counts
        rpg.set_memory_guard(2.0)
    return out


@pytest.fixture(scope="module")
def guard_world_reports() -> list[dict]:
    return run_ranks(_guard_world, 2, timeout=200, env=GATE)


def test_p3_exactly_the_threshold_free_collects_nothing_and_clears_nothing(
    guard_world_reports,
) -> None:
    for report in guard_world_reports:
        at, below = report["at"], report["below"]
        assert at["sums"] == below["sums"] == [3.0], report
        # The guard looked, and found exactly enough: no gc.collect(), no clear.
        assert at["probe"] >= 1, at
        assert (at["gc"], at["clear"]) == (0, 0), at
        # One byte less is short: both run (so the probe and the oracle see them at all).
        assert below["probe"] >= 1, below
        assert below["gc"] >= 1, below
        assert below["clear"] >= 1, below


def test_p3_worlds_stand_in_is_armed_by_each_reload_and_by_every_call(
    guard_world_reports,
) -> None:
    """Each reload arms WORLD's stand-in: WORLD is checked once between the start of the
    reload and its first collective (torch's own ``new_group`` calls WORLD's methods while the
    groups are re-created, and the first call of any method checks), and not again after.
    ``set_memory_guard(every_call=True)`` arms it at once: every collective on WORLD checks."""
    for report in guard_world_reports:
        for cycle in report["world_reloads"]:
            assert cycle["sums"] == [2.0] * 4, cycle
            assert cycle["first"] == 1, cycle  # checked once, by its first collective at the latest
            assert cycle["all"] == 1, cycle  # and the three collectives after it: no more
        assert report["world_settled"]["clear"] == 0, report["world_settled"]
        # every_call=True, chosen while WORLD is live: each collective on WORLD checks.
        assert all(count >= 1 for count in report["world_every_call"]), report


def _interrupted(ctx: Rank) -> dict:
    import torch

    rpg, dist = this_tree.begin(ctx)
    probe = memory_probes.EventProbe(free=int(1.5 * GiB))
    probe.install()
    pair = dist.new_group([0, 1])
    box: dict[str, Any] = {}
    worker = None
    if ctx.rank == 0:

        def stuck() -> None:  # rank 1 never joins this all_reduce
            try:
                dist.all_reduce(torch.ones(1), group=pair)
                box["outcome"] = "no error"
            except Exception as error:
                box["type"] = type(error).__name__
                box["ours"] = isinstance(error, rpg.ReloadPGError)
                box["outcome"] = str(error)
                box["notes"] = [str(n) for n in getattr(error, "__notes__", [])]

        worker = threading.Thread(target=stuck, daemon=True)
        worker.start()
    time.sleep(1.0)  # the worker is blocked in the collective; both ranks destroy now
    rpg.destroy_process_groups()
    if worker is not None:
        worker.join(20)
        box.setdefault("outcome", "hang: still blocked 20 s after destroy")
    rpg.reload_process_groups()
    box["sum"] = total(pair, 1.0)
    return box


@pytest.mark.timeout(300)
def test_p3_the_packages_error_for_an_interrupted_collective_carries_the_memory_note() -> None:
    """A thread blocked in a collective while the group is destroyed gets the package's error,
    and that error (not only the transport's, behind it) carries the memory note with the
    probe's figures."""
    for _attempt in range(3):  # the race has two outcomes; the package's error is the one here
        reports = run_ranks(_interrupted, 2, timeout=120, env=GATE)
        box = reports[0]
        assert [r["sum"] for r in reports] == [2.0, 2.0], reports
        if box.get("ours"):
            break
    assert box.get("ours"), box
    assert "reload_process_groups()" in box["outcome"], box
    notes = [n for n in box["notes"] if n.startswith("reloadpg_autopatch:")]
    assert len(notes) == 1, box
    for figure in ("1.50 GiB", "80.00 GiB", "17.00 GiB", "29.00 GiB"):
        assert figure in notes[0], (figure, notes[0])


# ---- 4. the environment and the command line ----------------------------------------------------

ON_SPELLINGS = ["1", " 1 ", "true", "TRUE", " True\t", "yes", "YES ", " yEs", "on", "ON", " On\t"]
OFF_SPELLINGS = ["", "   ", "0", " 0 ", "false", "FALSE", " False ", "no", " NO", "off", "Off\t"]

_META_PATH = (
    "import sys; print(sorted(getattr(f, '__module__', None) or type(f).__module__ "
    "for f in sys.meta_path))"
)


def test_p4_every_accepted_spelling_of_the_gate() -> None:
    """Each spelling of ``1 true yes on`` (any case, blanks around) installs the start-up import
    hook, silently; each of ``"" 0 false no off`` leaves the interpreter as with the variable
    unset. Oracle: the interpreter's ``sys.meta_path`` against the gate-unset run; then one
    spelling of each kind end to end, by what ``new_group`` returns after ``import torch``."""
    baseline = this_tree.python(_META_PATH, this_tree.env())
    assert baseline.returncode == 0, baseline.stderr
    for value in ON_SPELLINGS + OFF_SPELLINGS:
        proc = this_tree.python(_META_PATH, this_tree.env(SLIME_RELOADABLE_PG=value))
        assert proc.returncode == 0, (value, proc.stderr)
        assert proc.stderr == "", (value, proc.stderr)
        hooked = proc.stdout != baseline.stdout
        assert hooked is (value in ON_SPELLINGS), (value, proc.stdout, baseline.stdout)
    end_to_end = (
        "import torch.distributed as dist\n"
        "import reloadpg_autopatch as rpg\n"
        "rpg.set_wrap_policy('all')\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "print(type(dist.new_group([0])).__name__)\n"
    )
    for value, expected in ((" yEs\t", "ReloadableProcessGroup"), (" OFF ", "ProcessGroup")):
        proc = this_tree.python(end_to_end, this_tree.env(SLIME_RELOADABLE_PG=value))
        assert proc.returncode == 0, (value, proc.stderr)
        assert proc.stdout.split() == [expected], (value, proc.stdout, proc.stderr)


_GUARD_FROM_ENV = r"""
import json, logging, os, sys
import torch.distributed
import reloadpg_autopatch as rpg

cases = json.loads(sys.argv[1])
for name, value in cases:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a fresh read of the environment: nothing read it in the parent
        os.close(read)
        warnings = []

        class Keep(logging.Handler):
            def emit(self, record):
                warnings.append(record.getMessage())

        logging.getLogger("reloadpg_autopatch").addHandler(Keep(logging.WARNING))
        os.environ[name] = value
        guard = rpg.get_memory_guard()
        os.write(write, json.dumps([guard.min_free_gb, guard.every_call, warnings]).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.waitpid(pid, 0)
    print(json.dumps([name, value, json.loads(b"".join(chunks))]))
"""


def _guards_from_env(cases: list[tuple[str, str]]) -> list[tuple[str, str, list]]:
    proc = subprocess.run(
        [sys.executable, "-c", _GUARD_FROM_ENV, json.dumps(cases)],
        env=this_tree.env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(ROOT),
    )
    assert proc.returncode == 0, proc.stderr
    return [tuple(json.loads(line)) for line in proc.stdout.splitlines()]


def test_p4_every_call_switch_spellings_and_inf_from_the_environment() -> None:
    """``SLIME_RELOADABLE_PG_MEMORY_GUARD_EVERY_CALL``: every spelling of on turns it on and
    every spelling of off leaves it off, without a warning; ``SLIME_RELOADABLE_PG_MIN_FREE_GB=inf``
    is refused in one warning naming the variable, and the default used (issue 38: every number
    is finite and in range, or refused). Each read in a fresh forked child."""
    every = "SLIME_RELOADABLE_PG_MEMORY_GUARD_EVERY_CALL"
    cases = [(every, v) for v in ON_SPELLINGS + OFF_SPELLINGS]
    cases.append(("SLIME_RELOADABLE_PG_MIN_FREE_GB", "inf"))
    results = _guards_from_env(cases)
    assert len(results) == len(cases), results
    for name, value, (min_free, every_call, warnings) in results:
        if name == every:
            assert warnings == [], (name, value, warnings)
            assert every_call is (value in ON_SPELLINGS), (value, every_call)
            assert min_free == 3.0, (value, min_free)
        else:
            assert len(warnings) == 1, (name, value, warnings)
            assert "SLIME_RELOADABLE_PG_MIN_FREE_GB='inf'" in warnings[0], warnings
            assert min_free == 3.0, (value, min_free)
            assert every_call is False


def test_p4_a_bogus_mode_falls_back_to_exactly_wrapper_with_one_stderr_line() -> None:
    code = (
        "import torch.distributed as dist\n"
        "import reloadpg_autopatch as rpg\n"
        "print(rpg.get_reload_mode())\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "rpg.set_wrap_policy('all')\n"
        "print(type(dist.new_group([0])).__name__)\n"
    )
    proc = this_tree.python(
        code, this_tree.env(SLIME_RELOADABLE_PG="1", SLIME_RELOADABLE_PG_MODE="bogus")
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["wrapper", "ReloadableProcessGroup"], proc.stdout
    ours = [line for line in proc.stderr.splitlines() if line.startswith("reloadpg_autopatch")]
    assert len(ours) == 1, proc.stderr
    assert "SLIME_RELOADABLE_PG_MODE" in ours[0], ours
    assert "'bogus'" in ours[0], ours
    assert "wrapper" in ours[0], ours


def test_p4_demo_accepts_a_world_of_64_ranks() -> None:
    """The demo's bound is 64 ranks (docs/demo.md): 64 passes the argument checks, 65 does not.
    Nothing is started: a later check (``--cycles -1``) stops the command after the world size
    was judged, and the error it gives says which check it was."""
    env = this_tree.env()
    accepted = this_tree.cli("demo", "--world-size", "64", "--cycles", "-1", env=env)
    assert accepted.returncode == 2, accepted
    assert "--cycles must be 0 or more" in accepted.stderr, accepted.stderr
    assert "--world-size" not in accepted.stderr, accepted.stderr
    refused = this_tree.cli("demo", "--world-size", "65", "--cycles", "-1", env=env)
    assert refused.returncode == 2, refused
    assert "--world-size must be at most 64" in refused.stderr, refused.stderr
    helped = this_tree.cli("demo", "--help", env=env)
    assert helped.returncode == 0, helped
    assert "at most 64" in " ".join(helped.stdout.split()), helped.stdout


def test_p4_the_doctor_says_the_guard_is_off_at_zero() -> None:
    env = this_tree.env(SLIME_RELOADABLE_PG="1", SLIME_RELOADABLE_PG_MIN_FREE_GB="0")
    as_json = this_tree.cli("doctor", "--json", env=env)
    assert as_json.returncode == 0, as_json.stdout + as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["cycle"]["guard"]["min_free_gb"] == 0, report["cycle"]
    assert not [p for p in report["problems"] if "MIN_FREE" in p], report["problems"]
    text = this_tree.cli("doctor", env=env)
    assert text.returncode == 0, text.stdout + text.stderr
    guard = [line.split() for line in text.stdout.splitlines() if line.split()[:1] == ["guard"]]
    assert len(guard) == 1, text.stdout
    assert guard[0][1] == "off", guard


# ---- 5. hooks see WORLD first; a pool registered again comes back; freed bytes -------------------


def _hooks_pools_report(ctx: Rank) -> dict:
    import torch

    calls: list[tuple[str, Any, Any]] = []

    def register_mem_pool(self: Any, pool: Any, symm: bool = False) -> None:
        calls.append(("register", self, pool))

    def deregister_mem_pool(self: Any, pool: Any) -> None:
        calls.append(("deregister", self, pool))

    import torch.distributed as dist

    # gloo has no memory pools: a stand-in that logs, set before any group exists.
    dist.ProcessGroupGloo.register_mem_pool = register_mem_pool
    dist.ProcessGroupGloo.deregister_mem_pool = deregister_mem_pool
    rpg, dist = this_tree.begin(ctx, world=True)
    probe = memory_probes.EventProbe(free=10 * GiB)
    probe.step = 3 * MiB + 7  # every reading is larger than the one before: memory was freed
    probe.install()
    a, b = dist.new_group([0, 1]), dist.new_group([0, 1])
    seen: list[list[str]] = []
    marks: list[int] = []  # how many readings the probe had given when the hooks ran

    def before_destroy(groups: list) -> None:
        names = {id(dist.group.WORLD): "WORLD", id(a): "a", id(b): "b"}
        seen.append([names.get(id(g), repr(g)) for g in groups])
        marks.append(len(probe.returned))

    rpg.add_reload_hook(before_destroy=before_destroy, name="who")
    out: dict[str, Any] = {"hooks": seen}

    cpu = torch.device("cpu")
    pool = object()
    a._get_backend(cpu).register_mem_pool(pool)
    rpg.destroy_process_groups()
    rpg.reload_process_groups()
    # Between reloads the program deregisters the pool and registers it again.
    backend = a._get_backend(cpu)
    backend.deregister_mem_pool(pool)
    backend.register_mem_pool(pool)
    rpg.destroy_process_groups()
    del calls[:]
    rpg.reload_process_groups()
    new = a._get_backend(cpu)
    out["pool_at_next_reload"] = [(op, b_ is new, p is pool) for op, b_, p in calls]
    out["new_backend"] = new is not backend
    out["sums"] = [total(a, 1.0), total(b, 1.0), total(None, 1.0)]

    report = rpg.last_cycle_report()
    before, after = report.memory["before_destroy"], report.memory["after_destroy"]
    out["freed"] = {
        "freed_bytes": report.freed_bytes,
        "before": list(before) if before is not None else None,
        "after": list(after) if after is not None else None,
        "returned": [list(f) for f in probe.returned],
        "hooks_at": marks[-1],
    }
    return out


@pytest.fixture(scope="module")
def hooks_pools_reports() -> list[dict]:
    return run_ranks(_hooks_pools_report, 2, timeout=200, env=GATE)


def test_p5_before_destroy_hooks_receive_world_first(hooks_pools_reports) -> None:
    for report in hooks_pools_reports:
        assert report["sums"] == [2.0, 2.0, 2.0], report
        assert report["hooks"] == [["WORLD", "a", "b"]] * 2, report["hooks"]


def test_p5_a_pool_deregistered_and_registered_again_comes_back_at_the_next_reload(
    hooks_pools_reports,
) -> None:
    for report in hooks_pools_reports:
        assert report["new_backend"], report
        assert report["pool_at_next_reload"] == [("register", True, True)], report


def test_p5_freed_bytes_is_the_difference_of_the_figures_it_is_made_from(
    hooks_pools_reports,
) -> None:
    for report in hooks_pools_reports:
        freed = report["freed"]
        before, after, returned = freed["before"], freed["after"], freed["returned"]
        # Both figures are readings of the test's probe, the later one after the earlier one.
        assert before in returned, freed
        assert after in returned, freed
        assert returned.index(after) > returned.index(before), freed
        # Before the hooks and the destroy, and after them: nothing is freed in between.
        assert returned.index(before) < freed["hooks_at"] <= returned.index(after), freed
        free = 0  # MemoryFigures(free, total, allocated, reserved)
        assert after[free] > before[free], freed
        assert freed["freed_bytes"] == after[free] - before[free], freed


# ---- 6. one step at a time; threads as ranks -----------------------------------------------------


def _two_threads_destroy(ctx: Rank) -> dict:
    rpg, dist = this_tree.begin(ctx)
    group = dist.new_group([0])
    inside, second_done = threading.Event(), threading.Event()

    def hold(groups: list) -> None:  # the first destroy waits here for the second call
        inside.set()
        second_done.wait(20)

    rpg.add_reload_hook(before_destroy=hold, name="hold")
    out: dict[str, Any] = {}

    def first() -> None:
        try:
            rpg.destroy_process_groups()
            out["first"] = "no error"
        except Exception as error:
            out["first"] = f"{type(error).__name__}: {error}"

    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    out["entered"] = inside.wait(20)
    started = time.monotonic()
    try:
        rpg.destroy_process_groups()
        out["second"] = "no error"
    except Exception as error:
        out["second"] = str(error)
        out["second_type"] = type(error).__name__
        out["step_in_progress"] = isinstance(error, rpg.StepInProgressError)
    out["second_s"] = time.monotonic() - started
    second_done.set()
    thread.join(30)
    out["first_alive"] = thread.is_alive()
    rpg.reload_process_groups()
    out["sum"] = total(group, 1.0)
    return out


def test_p6_a_second_thread_destroying_at_once_gets_the_one_thread_error() -> None:
    (report,) = run_ranks(_two_threads_destroy, 1, timeout=120, env=GATE)
    assert report["entered"], report
    assert report["step_in_progress"], report
    assert "another thread" in report["second"], report
    assert report["second_s"] < 5, report  # refused at once, not after the first one
    assert report["first"] == "no error", report
    assert not report["first_alive"], report
    assert report["sum"] == 1.0, report


def _threaded_world(ctx: Rank) -> dict:
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed import multi_threaded_pg

    rpg = this_tree.package()
    assert rpg.is_patched()
    rpg.set_wrap_policy("all")
    # As torch's MultiThreadedTestCase sets them up: names per thread, a world per thread.
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    multi_threaded_pg._install_threaded_pg()
    store = dist.HashStore()
    results: dict[int, Any] = {}

    def rank(r: int) -> None:
        try:
            dist.init_process_group("threaded", rank=r, world_size=4, store=store)
            whole = dist.new_group([0, 1, 2, 3])
            timings = []
            for _cycle in range(2):
                started = time.monotonic()
                rpg.destroy_process_groups()
                between = time.monotonic()
                rpg.reload_process_groups()
                timings += [between - started, time.monotonic() - between]
            t = torch.tensor([r + 1.0])
            dist.all_reduce(t, group=whole)
            results[r] = {"timings": timings, "sum": t.item()}
            dist.destroy_process_group()
        except Exception as error:
            results[r] = f"{type(error).__name__}: {error}"

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(40)
    hung = [r for r, thread in enumerate(threads) if thread.is_alive()]
    if not hung:
        multi_threaded_pg._uninstall_threaded_pg()
    return {"results": results, "hung": hung}


def test_p6_destroy_and_reload_from_the_rank_threads_of_a_threaded_world_return_at_once() -> None:
    (report,) = run_ranks(_threaded_world, 1, timeout=120, env=GATE)
    assert report["hung"] == [], report
    assert set(report["results"]) == {0, 1, 2, 3}, report
    for rank, result in report["results"].items():
        assert isinstance(result, dict), (rank, result)
        assert result["sum"] == 10.0, (rank, result)
        assert all(seconds < 0.5 for seconds in result["timings"]), (rank, result)


# ---- 7. a string annotation through a dotted alias several levels deep ---------------------------


def test_p7_rule_finds_a_group_named_through_dotted_aliases() -> None:
    from reloadpg_autopatch.patching.rule import function_group_params
    from tests.support import promise_annotations as annotated

    for name in annotated.TAKE_A_GROUP:
        assert function_group_params(getattr(annotated, name)) == ("handle",), name
    assert function_group_params(annotated.not_a_group) == (), "an int is no group"


def _deep_alias_end_to_end(ctx: Rank) -> dict:
    import warnings

    import torch
    import torch.distributed as dist

    from tests.support import promise_annotations as annotated

    warnings.simplefilter("ignore", FutureWarning)
    rpg = this_tree.package()
    assert not rpg.is_patched()
    # As if a future torch had added them to its namespace: the patch derives its set from it.
    for name in (*annotated.TAKE_A_GROUP, "not_a_group"):
        setattr(dist, f"promise_{name}", getattr(annotated, name))
    rpg.monkey_patch_torch_dist()
    rpg.set_wrap_policy("all")
    ctx.init(timeout=this_tree.TIMEOUT.total_seconds())
    group = dist.new_group([0])
    out: dict[str, Any] = {"group": type(group).__name__}
    for name in annotated.TAKE_A_GROUP:
        wrapper = getattr(dist, f"promise_{name}")
        got = wrapper(torch.ones(1), handle=group)
        positional = wrapper(torch.ones(1), group)
        out[name] = {
            "wrapped": wrapper is not getattr(annotated, name),
            "keyword": type(got).__name__,
            "native": got is group.group,
            "positional": positional is group.group,
        }
    untouched = dist.promise_not_a_group
    out["not_a_group"] = {
        "wrapped": untouched is not annotated.not_a_group,
        "passes_through": untouched(torch.ones(1), handle=group) is group,
    }
    return out


def test_p7_the_generated_wrapper_unwraps_a_reloadable_group_passed_there() -> None:
    from tests.support import promise_annotations as annotated

    (report,) = run_ranks(_deep_alias_end_to_end, 1, timeout=120)
    assert report["group"] == "ReloadableProcessGroup", report
    for name in annotated.TAKE_A_GROUP:
        assert report[name] == {
            "wrapped": True,
            "keyword": "ProcessGroup",
            "native": True,
            "positional": True,
        }, (name, report[name])
    assert report["not_a_group"] == {"wrapped": False, "passes_through": True}, report


# ---- 8. WORLD comes back with its bound device and options -------------------------------------

#: A backend torch registers for no CPU device, as it does NCCL: a Python subclass of gloo's
#: backend (the collectives stay gloo's) that keeps the options it was created with.
FAKE_ACCELERATOR = "promisesacc"


def _world_device_and_options(ctx: Rank) -> dict:
    import warnings

    import torch
    import torch.distributed as dist

    warnings.simplefilter("ignore", FutureWarning)
    rpg = this_tree.package()
    assert rpg.is_patched()
    rpg.set_wrap_policy("all")
    keep = []  # torch 2.13 forgets a Python backend object that nobody references

    class Accelerator(dist.ProcessGroupGloo):
        def __init__(self, store: Any, rank: int, size: int, timeout: Any, given: Any) -> None:
            super().__init__(store, rank, size, timeout)
            self.given = given

        @property
        def options(self) -> Any:  # as NCCL's backend returns its Options
            return self.given

        @property
        def supports_splitting(self) -> bool:
            return False

    def create(common: Any, backend_options: Any) -> Any:
        backend = Accelerator(
            common.store, common.group_rank, common.group_size, common.timeout, backend_options
        )
        keep.append(backend)
        return backend

    dist.Backend.register_backend(FAKE_ACCELERATOR, create, extended_api=True, devices=["cuda"])
    options = dist.ProcessGroupGloo._Options()
    options._timeout = this_tree.TIMEOUT
    store = dist.TCPStore(
        HOST, ctx.port, ctx.world_size, is_master=False, timeout=this_tree.TIMEOUT
    )
    dist.init_process_group(
        f"cpu:gloo,cuda:{FAKE_ACCELERATOR}",
        store=store,
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=this_tree.TIMEOUT,
        pg_options=options,
    )
    # init_process_group(device_id=cuda:N) binds the device; a CPU build refuses a CUDA device,
    # so it is bound as torch binds it, on the group.
    device = torch.device("cuda", 0)
    dist.group.WORLD.bound_device_id = device
    rpg.register_default_process_group()  # swapped: its backend serves no CPU device
    real = dist.init_process_group
    received: list[dict[str, Any]] = []

    def spy(*args: Any, **kwargs: Any) -> None:
        received.append({"args": args, **kwargs})
        given = kwargs.pop("device_id", None)  # what torch on a GPU would bind
        real(*args, **kwargs)
        if given is not None:
            from torch.distributed import distributed_c10d as c10d

            c10d._world.default_pg.bound_device_id = given

    dist.init_process_group = spy
    try:
        rpg.destroy_process_groups()
        rpg.reload_process_groups()
    finally:
        dist.init_process_group = real

    def backend_of(call: dict[str, Any]) -> Any:
        return call.get("backend", call["args"][0] if call["args"] else None)

    restores = [c for c in received if backend_of(c) == f"cpu:gloo,cuda:{FAKE_ACCELERATOR}"]
    return {
        "calls": len(received),
        "restores": [
            {
                "device_id": str(c.get("device_id")),
                "pg_options_is_registered": c.get("pg_options") is options,
            }
            for c in restores
        ],
        "bound_after": str(dist.group.WORLD.bound_device_id),
        "world_type": type(dist.group.WORLD).__name__,
    }


def test_p8_world_comes_back_with_its_bound_device_and_options() -> None:
    reports = run_ranks(_world_device_and_options, 2, timeout=150, env=GATE)
    for report in reports:
        assert report["calls"] == 2, report  # the temporary WORLD, then WORLD again
        assert report["restores"] == [{"device_id": "cuda:0", "pg_options_is_registered": True}], (
            report
        )
        assert report["bound_after"] == "cuda:0", report
