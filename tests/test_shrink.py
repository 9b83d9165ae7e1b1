"""Shrinking a group (torch's dist.shrink_group): the survivors of a rank SIGKILLed mid-collective
see their op fail naming it, read it from pycomm.failed_ranks() and get_error(), shrink the group
without it and go on with correct results; bad shrinks fail clearly on every rank; repeated shrinks
give back their sockets, threads and shared memory.

Measured figures are printed with the ``[reliability]`` prefix (run with ``-s``); see
docs/RELIABILITY.md.
"""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from cluster import Cluster, Control, error_info, report, shm_pycomm_files
from mp import run_ranks

SHRINK_PG_TIMEOUT_S = 10.0
STOP_PG_TIMEOUT_S = 3.0  # a SIGSTOPped rank is detected by the timeout
# From the detection (at once for a SIGKILL, the timeout for a SIGSTOP) to the first collective on
# the shrunk group (the goal is 2 s); a bound against hangs with room for a loaded machine.
SHRINK_MAX_S = 8.0
# A disagreement must be seen from the keys, never by waiting for the timeout.
DISAGREE_MAX_S = 5.0
ROOT = Path(__file__).resolve().parent.parent


def _backend() -> Any:
    return dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))


def _numel_for(transport: str) -> int:
    return 64 * 1024  # 256 KiB of float32: several chunks, over shared memory or sockets


def _survive_and_shrink_worker(rank: int, world: int, ctl: Control, doomed: int, numel: int) -> dict[str, Any]:
    import pycomm

    t = torch.empty(numel, dtype=torch.float32)
    error = None
    iterations = 0
    start = time.monotonic()
    try:
        while time.monotonic() - start < 60.0:  # bounded even if nobody dies
            t.fill_(rank + 1)
            dist.all_reduce(t)
            iterations += 1
            if iterations == 5:
                ctl.event("looping", os.getpid())
    except RuntimeError as exc:
        error = error_info(exc)
    lost = pycomm.failed_ranks()
    kind = str(_backend().get_error())
    shrink_start = time.monotonic()
    dist.shrink_group(lost)
    shrunk_at = time.monotonic()
    new_rank, new_size = dist.get_rank(), dist.get_world_size()
    # Independent reference: the survivors' old ranks, in order, and an exact integer sum.
    old = torch.tensor([rank], dtype=torch.int64)
    gathered = [torch.empty(1, dtype=torch.int64) for _ in range(new_size)]
    dist.all_gather(gathered, old)
    x = torch.arange(numel, dtype=torch.int64) * (rank + 1)
    dist.all_reduce(x)
    first_step_at = time.monotonic()
    survivors = [r for r in range(world) if r != doomed]
    expected = torch.arange(numel, dtype=torch.int64) * sum(r + 1 for r in survivors)
    f = torch.randn(numel + 7, generator=torch.Generator().manual_seed(rank), dtype=torch.float32)
    reference = sum(torch.randn(numel + 7, generator=torch.Generator().manual_seed(r), dtype=torch.float32).double()
                    for r in survivors)
    dist.all_reduce(f)
    return {
        "error": error,
        "lost": lost,
        "kind": kind,
        "new_rank": new_rank,
        "new_size": new_size,
        "order": [int(g.item()) for g in gathered],
        "sum_exact": bool(torch.equal(x, expected)),
        "float_err": float((f.double() - reference).abs().max()),
        "shrink_s": shrunk_at - shrink_start,
        "first_step_at": first_step_at,
        "iterations": iterations,
    }


@pytest.mark.parametrize(
    "world,transport,sig", [(3, "tcp", "KILL"), (4, "auto", "KILL"), (3, "tcp", "STOP"), (4, "auto", "STOP")]
)
def test_survivors_shrink_after_a_lost_rank_and_go_on(pycomm: ModuleType, world: int, transport: str, sig: str) -> None:
    """transport auto: one host, so the group and the shrunk group run over shared memory. A
    SIGSTOPped rank is lost once the timeout names it: the rank that waits for it finds it does not
    answer a probe, the ranks that wait for live peers find those do, and all name the frozen one."""
    doomed = 1
    pg_timeout_s = SHRINK_PG_TIMEOUT_S if sig == "KILL" else STOP_PG_TIMEOUT_S
    with Cluster(
        _survive_and_shrink_worker,
        world,
        args=(doomed, _numel_for(transport)),
        env={"PYCOMM_TRANSPORT": transport},
        pg_timeout_s=pg_timeout_s,
        hang_timeout_s=90,
    ) as c:
        killed_at, survivors = c.kill_in_loop(doomed, signal.SIGKILL if sig == "KILL" else signal.SIGSTOP, 0.2)
        results = {r: c.result(r, timeout=SHRINK_PG_TIMEOUT_S + 30) for r in survivors}

    problems = []
    for new_rank, (rank, res) in enumerate(results.items()):
        label = f"rank {rank} (world {world}, transport {transport}, SIG{sig})"
        err = res["error"]
        if err is None:
            problems.append(f"{label}: no error after rank {doomed} was killed")
        elif not re.search(rf"\b(peer|rank) {doomed}\b(?!/)", err["message"]):  # not a "[rank r/p]" prefix
            problems.append(f"{label}: the error does not name rank {doomed}: {err['message']!r}")
        if res["lost"] != [doomed]:
            problems.append(f"{label}: failed_ranks() is {res['lost']}, not [{doomed}]")
        kinds = ("ErrorType.COMM_ERROR", "ErrorType.REMOTE_ERROR") if sig == "KILL" else (
            "ErrorType.TIMEOUT", "ErrorType.REMOTE_ERROR")
        if res["kind"] not in kinds:
            problems.append(f"{label}: get_error() is {res['kind']}")
        if (res["new_rank"], res["new_size"]) != (new_rank, world - 1):
            problems.append(f"{label}: rank {res['new_rank']} of {res['new_size']} after the shrink")
        if res["order"] != survivors:
            problems.append(f"{label}: the shrunk group's ranks are old ranks {res['order']}, not {survivors}")
        if not res["sum_exact"]:
            problems.append(f"{label}: the int64 all_reduce on the shrunk group is wrong")
        if res["float_err"] > 1e-4:
            problems.append(f"{label}: float32 all_reduce off by {res['float_err']:.2e} (tolerance 1e-4)")
        recovered_s = res["first_step_at"] - killed_at
        report(
            f"shrink after SIG{sig} (world {world}, transport {transport}, timeout {pg_timeout_s:.0f}s): rank {rank} saw "
            f"{err['type'] if err else None} ({res['kind']}), failed_ranks {res['lost']}, shrink took "
            f"{res['shrink_s'] * 1000:.0f} ms, first op on the shrunk group {recovered_s * 1000:.0f} ms after the signal"
        )
        if sig == "STOP":
            recovered_s -= pg_timeout_s  # detection is the timeout itself
        if recovered_s > SHRINK_MAX_S:
            problems.append(f"{label}: first op on the shrunk group {recovered_s:.1f}s after the detection")
    assert not problems, "\n".join(problems)


def _bad_shrinks_worker(rank: int, world: int) -> dict[str, Any]:
    import pycomm

    out: dict[str, Any] = {}
    # The ranks disagree: each excludes the next one. Everyone raises at once, naming both sets.
    start = time.monotonic()
    try:
        dist.shrink_group([(rank + 1) % world])
        out["disagree"] = None
    except RuntimeError as exc:
        out["disagree"] = (str(exc), time.monotonic() - start)
    # The failed shrink left the group as it was.
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    out["after_disagree"] = t.tolist()
    out["lost_while_healthy"] = pycomm.failed_ranks()
    out["kind_while_healthy"] = str(_backend().get_error())
    for name, excluded in (("self", [rank]), ("everyone", list(range(world)))):
        try:
            dist.shrink_group(excluded)
            out[name] = None
        except (RuntimeError, ValueError) as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    # The last rank leaves; the others shrink it away although it is alive (it does not call).
    sub = dist.new_group(list(range(world)))
    if rank == world - 1:
        dist.destroy_process_group(sub)
        out["shrunk"] = None
    else:
        shrunk = dist.shrink_group([world - 1], group=sub)
        y = torch.full((3,), float(rank + 1))
        dist.all_reduce(y, group=shrunk)
        out["shrunk"] = (dist.get_rank(shrunk), dist.get_world_size(shrunk), y.tolist())
        # The old group is gone: shrinking it again fails clearly.
        try:
            dist.shrink_group([world - 1], group=sub)
            out["destroyed"] = None
        except (RuntimeError, ValueError) as exc:
            out["destroyed"] = f"{type(exc).__name__}: {exc}"
        dist.destroy_process_group(shrunk)
    return out


def test_bad_shrinks_fail_clearly_on_every_rank(pycomm: ModuleType) -> None:
    world = 3
    results = run_ranks(_bad_shrinks_worker, world, backend="pycomm", timeout_s=90, pg_timeout_s=20)
    problems = []
    for rank, res in enumerate(results):
        disagree = res["disagree"]
        if disagree is None:
            problems.append(f"rank {rank}: a shrink the ranks disagree on succeeded")
        else:
            message, took = disagree
            # The one other rank this rank keeps, rank + 2, excludes this rank.
            mine, theirs = f"excludes [{(rank + 1) % world}]", f"rank {(rank + 2) % world} excludes [{rank}]"
            if "disagree" not in message or mine not in message or theirs not in message:
                problems.append(f"rank {rank}: the disagreement message does not name both sets: {message!r}")
            if took > DISAGREE_MAX_S:
                problems.append(f"rank {rank}: the disagreement took {took:.1f}s to raise")
        if res["after_disagree"] != [float(sum(range(1, world + 1)))] * 5:
            problems.append(f"rank {rank}: all_reduce after the failed shrink gave {res['after_disagree']}")
        if res["lost_while_healthy"] != [] or res["kind_while_healthy"] not in ("ErrorType.SUCCESS",):
            problems.append(f"rank {rank}: healthy group reports {res['lost_while_healthy']} {res['kind_while_healthy']}")
        for name in ("self", "everyone"):
            if res[name] is None:
                problems.append(f"rank {rank}: shrinking away {name} succeeded")
        if rank < world - 1:
            if res["shrunk"] != (rank, world - 1, [float(sum(range(1, world)))] * 3):
                problems.append(f"rank {rank}: the shrunk subgroup gave {res['shrunk']}")
            if res["destroyed"] is None:
                problems.append(f"rank {rank}: shrinking a destroyed group succeeded")
    assert not problems, "\n".join(problems)


def _abort_and_old_subgroups_worker(rank: int, world: int) -> dict[str, Any]:
    """Rank 2 leaves; ranks 0 and 1 have a receive from it in flight and shrink with SHRINK_ABORT:
    the receive fails (aborted), the shrink succeeds, and a subgroup made before the shrink of the
    default group fails clearly when used (torch destroys it, as it documents)."""
    out: dict[str, Any] = {}
    sub = dist.new_group([0, 1])
    if rank == 2:
        dist.barrier()
        time.sleep(8)  # alive and connected while the others shrink: only the abort ends their receive
        return out
    pending = dist.irecv(torch.empty(10), src=2)
    dist.barrier()
    shrunk = dist.shrink_group([2], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
    try:
        pending.wait()
        out["pending"] = None
    except RuntimeError as exc:
        out["pending"] = str(exc)
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t, group=shrunk)
    out["after"] = t.tolist()
    try:
        dist.all_reduce(torch.ones(1), group=sub)
        out["old_subgroup"] = None
    except (RuntimeError, ValueError) as exc:
        out["old_subgroup"] = f"{type(exc).__name__}: {exc}"
    return out


def test_shrink_abort_fails_what_is_in_flight_and_old_subgroups_fail_clearly(pycomm: ModuleType) -> None:
    results = run_ranks(_abort_and_old_subgroups_worker, 3, backend="pycomm", timeout_s=90, pg_timeout_s=20)
    for rank in (0, 1):
        res = results[rank]
        # The abort's own words: without SHRINK_ABORT the receive would fail later, when torch
        # destroys the old group ("the process group was shut down").
        assert res["pending"] is not None and "SHRINK_ABORT" in res["pending"], (rank, res["pending"])
        assert res["after"] == [3.0] * 4, (rank, res["after"])
        assert res["old_subgroup"] is not None, (rank, "a subgroup of the shrunk default group still ran")
        report(f"SHRINK_ABORT: rank {rank}: pending receive -> {res['pending'][:100]!r}; "
               f"old subgroup -> {res['old_subgroup'][:120]!r}")


def _repeated_shrinks_worker(rank: int, world: int, rounds: int) -> dict[str, Any]:
    """``rounds`` shrinks of a fresh subgroup of every rank (one rank leaves it and stays), and
    every third round a shrink of the default group too, whose last rank leaves for good: world
    ``world`` down to 2 at most. Each subgroup round must give back what it took."""

    def counts() -> tuple[int, int]:
        return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))

    dist.barrier()
    before = counts()
    leaks = []
    for i in range(rounds):
        size = dist.get_world_size()
        me = dist.get_rank()
        start = counts()
        sub = dist.new_group(list(range(size)))
        leaving = i % size
        if me == leaving:
            dist.destroy_process_group(sub)
        else:
            shrunk = dist.shrink_group([leaving], group=sub)
            t = torch.ones(1000)
            dist.all_reduce(t, group=shrunk)
            assert t[0].item() == size - 1, t[0].item()
            dist.destroy_process_group(shrunk)
            del shrunk
        del sub  # a group's last reference holds its backend (and its sockets) until it goes
        gc.collect()
        dist.barrier()
        if counts() != start:
            leaks.append((i, start, counts()))
        if i % 3 == 2 and size > 2:
            if me == size - 1:
                return {"left_at": i, "leaks": leaks, "before": before, "after": counts()}
            dist.shrink_group([size - 1])
    dist.barrier()
    return {"left_at": None, "leaks": leaks, "before": before, "after": counts()}


def _churn_shape() -> tuple[int, int]:
    """World and rounds: 4 and 6 in the suite; PYCOMM_SHRINK_CHURN="8,20" for the documented figure."""
    world, rounds = (int(v) for v in os.environ.get("PYCOMM_SHRINK_CHURN", "4,6").split(","))
    return world, rounds


def test_repeated_shrinks_give_back_fds_threads_and_shared_memory(pycomm: ModuleType) -> None:
    world, rounds = _churn_shape()
    shm_before = shm_pycomm_files()
    # A file store: rank 0 would host a TCPStore, whose clients' sockets (torch clones the store at
    # each shrink) come and go in rank 0's fd table with every rank that joins or leaves.
    results = run_ranks(_repeated_shrinks_worker, world, backend="pycomm", timeout_s=60 + 15 * rounds,
                        args=(rounds,), pg_timeout_s=20, init="file")
    leaked_shm = shm_pycomm_files() - shm_before
    problems = []
    for rank, res in enumerate(results):
        report(f"{rounds} shrink rounds (world {world}): rank {rank} (fds, threads) {res['before']} at the start, "
               f"{res['after']} at the end" + (f", left at round {res['left_at']}" if res["left_at"] is not None else ""))
        for i, start, end in res["leaks"]:
            problems.append(f"rank {rank}: round {i} took (fds, threads) {start} to {end}")
        if res["after"][0] > res["before"][0] or res["after"][1] > res["before"][1]:
            problems.append(f"rank {rank}: (fds, threads) {res['before']} at the start, {res['after']} at the end")
    if leaked_shm:
        problems.append(f"/dev/shm entries left: {sorted(leaked_shm)}")
    assert not problems, "\n".join(problems)


def test_shrink_across_namespace_hosts() -> None:
    """2 hosts x 2 ranks (network namespaces); rank 3 of host 1 is SIGKILLed mid-all-reduce; the
    survivors shrink to 2 ranks on host 0 and 1 on host 1 and run a hierarchical all-reduce exactly."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from netns import Testbed, available

    if available() is not None:
        pytest.skip(f"network namespaces unavailable: {available()}")
    worker = Path(__file__).with_name("shrink_multihost_worker.py")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYCOMM_SOCKET_IFNAME="eth0")
    with Testbed(hosts=2) as bed:
        procs = [
            bed.popen(rank // 2, [sys.executable, str(worker), "--rank", str(rank), "--world", "4", "--master",
                                  bed.address(0), "--port", "29813"], env=env, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)
            for rank in range(4)
        ]
        outputs = []
        try:
            for proc in procs:
                outputs.append(proc.communicate(timeout=120))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
    for rank in range(3):
        out, err = outputs[rank]
        assert procs[rank].returncode == 0, f"rank {rank}: exit {procs[rank].returncode}\n{err[-3000:]}"
        line = out.strip().splitlines()[-1]
        assert line.startswith(f"SHRUNK {rank} 3 [3] "), line
        report(f"shrink across 2 namespace hosts (2 x 2, rank 3 SIGKILLed): rank {rank}: {line}")
    assert procs[3].returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), procs[3].returncode  # direct or via a wrapper
