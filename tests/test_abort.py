"""abort() and shutdown(): with an isend in flight to a peer that never receives (SIGSTOPped), from
a watchdog thread while a collective is blocked, and a failure seen on another socket waking a
waiting reader.

Measured figures are printed with the ``[reliability]`` prefix (run with ``-s``); see
docs/RELIABILITY.md. Ranks run under cluster.Cluster, or mp.run_ranks where only their results matter.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from cluster import DESTROY_MAX_S, EXIT_MAX_S, Cluster, Control, report


# abort() / shutdown() with an isend in flight to a peer that never receives (SIGSTOPped).

ABORT_MAX_S = 2.0


def _abort_worker(rank: int, world: int, ctl: Control, method: str, then: str) -> dict[str, Any]:
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    ctl.event("ready", os.getpid())
    out: dict[str, Any] = {}
    if rank == 1:
        assert ctl.command() == "exit"
    else:
        assert ctl.command() == "go"  # rank 1 is stopped now: it reads nothing
        payload = torch.ones(16 * 1024 * 1024)  # 64 MiB: far more than the socket buffers hold
        work = dist.isend(payload, dst=1)
        time.sleep(0.5)
        out["in_flight"] = not work.is_completed()
        t0 = time.monotonic()
        getattr(backend, method)()
        out["first_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        getattr(backend, method)()
        out["second_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        try:
            work.wait()
            out["work"] = "completed"
        except Exception as exc:  # noqa: BLE001
            out["work"] = f"{type(exc).__name__}: {exc}"
        out["work_wait_s"] = time.monotonic() - t0
        # A collective on the aborted group must fail at once, not hang.
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4))
            out["after"] = "completed"
        except Exception as exc:  # noqa: BLE001
            out["after"] = f"{type(exc).__name__}: {exc}"
        out["after_s"] = time.monotonic() - t0
    if then == "destroy":
        t0 = time.monotonic()
        dist.destroy_process_group()
        out["destroy_s"] = time.monotonic() - t0
    out["returned_at"] = time.monotonic()
    return out


@pytest.mark.parametrize("then", ["destroy", "exit"])
@pytest.mark.parametrize("method", ["abort", "shutdown"])
def test_abort_and_shutdown_with_isend_in_flight(pycomm: ModuleType, method: str, then: str) -> None:
    pg_timeout_s = 10.0
    with Cluster(
        _abort_worker,
        2,
        args=(method, then),
        pg_timeout_s=pg_timeout_s,
        hang_timeout_s=90,
        destroy=False,  # the worker decides ("exit": leave it to interpreter exit)
    ) as c:
        with c.stopped(1):
            c.send(0, "go")
            r0 = c.result(0, timeout=40)
            code0, exit0_s = c.wait_exit(0, timeout=EXIT_MAX_S)
        c.send(1, "exit")
        r1 = c.result(1, timeout=40)
        code1, exit1_s = c.wait_exit(1, timeout=EXIT_MAX_S)
        logs = [c.stderr(0), c.stderr(1)]

    report(
        f"{method}() with a 64 MiB isend in flight ({then}): first call {r0['first_s'] * 1000:.1f} ms, "
        f"second {r0['second_s'] * 1000:.1f} ms, isend wait {r0['work_wait_s'] * 1000:.1f} ms -> "
        f"{r0['work'][:120]!r}; rank 0 exited {exit0_s:.2f}s after returning"
    )
    problems = []
    if not r0["in_flight"]:
        problems.append("the isend had completed before the call (the peer was stopped)")
    limit = ABORT_MAX_S if method == "abort" else pg_timeout_s + ABORT_MAX_S
    if r0["first_s"] > limit:
        problems.append(f"first {method}() took {r0['first_s']:.2f}s (limit {limit}s)")
    if r0["second_s"] > ABORT_MAX_S:
        problems.append(f"second {method}() took {r0['second_s']:.2f}s")
    if r0["work"] == "completed":
        problems.append("the in-flight isend reported success although the peer never read it")
    if r0["work_wait_s"] > ABORT_MAX_S:
        problems.append(f"waiting on the aborted isend took {r0['work_wait_s']:.2f}s")
    if r0["after"] == "completed" or r0["after_s"] > ABORT_MAX_S:
        problems.append(
            f"all_reduce after {method}(): {r0['after'][:200]!r} in {r0['after_s']:.2f}s "
            "(expected a prompt error)"
        )
    if then == "destroy":
        for rank, res in enumerate((r0, r1)):
            if res["destroy_s"] > DESTROY_MAX_S:
                problems.append(f"rank {rank}: destroy_process_group took {res['destroy_s']:.1f}s")
    for rank, (code, waited) in enumerate(((code0, exit0_s), (code1, exit1_s))):
        if code != 0:
            problems.append(
                f"rank {rank}: exit code {code} {waited:.1f}s after returning (None: hung at "
                f"interpreter exit)\n{logs[rank][-3000:]}"
            )
    assert not problems, "\n".join(problems)


def _abort_from_thread_worker(rank: int, world: int, ctl: Control, method: str, numel: int) -> dict[str, Any]:
    """Rank 0 blocks in an all_reduce that its stopped peer never joins; another thread aborts."""
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    if not _ready_unless_stopped(rank, ctl):
        return {}
    timer = threading.Timer(0.5, getattr(backend, method))
    timer.start()
    out = _timed_outcome(lambda: dist.all_reduce(torch.ones(numel)))
    timer.join()
    return out


def _ready_unless_stopped(rank: int, ctl: Control) -> bool:
    """Checks the group, says "ready", then waits: for "exit" on rank 1 (the rank the test stops;
    False), for "go" on the others (True)."""
    dist.all_reduce(torch.ones(8))  # the group works
    ctl.event("ready", os.getpid())
    if rank == 1:
        assert ctl.command() == "exit"
        return False
    assert ctl.command() == "go"
    return True


def _timed_outcome(op: Callable[[], Any]) -> dict[str, Any]:
    """How `op` ended ("completed" or the exception) and how long it blocked."""
    out: dict[str, Any] = {}
    t0 = time.monotonic()
    try:
        op()
        out["outcome"] = "completed"
    except Exception as exc:  # noqa: BLE001
        out["outcome"] = f"{type(exc).__name__}: {exc}"
    out["blocked_s"] = time.monotonic() - t0
    return out


# The default transport (shared memory on this host), and TCP with a message short enough that the
# blocked thread reads its socket itself, asleep in poll() when the abort comes.
_BLOCKED_OPS = {"auto-4MiB": ("auto", 1024 * 1024), "tcp-4KiB": ("tcp", 1024)}


@pytest.mark.parametrize("blocked", sorted(_BLOCKED_OPS))
@pytest.mark.parametrize("method", ["abort", "shutdown"])
def test_abort_from_another_thread_unblocks_collective(pycomm: ModuleType, method: str, blocked: str) -> None:
    """The watchdog pattern: a blocked collective must end soon after abort()/shutdown()."""
    # abort: a long timeout, so an end that only came from the timeout is distinguishable.
    # shutdown: graceful (see below), so a short timeout keeps the case quick.
    pg_timeout_s = 20.0 if method == "abort" else 5.0
    transport, numel = _BLOCKED_OPS[blocked]
    with Cluster(
        _abort_from_thread_worker, 2, args=(method, numel), env={"PYCOMM_TRANSPORT": transport},
        pg_timeout_s=pg_timeout_s, hang_timeout_s=90,
    ) as c:
        with c.stopped(1):
            c.send(0, "go")
            r0 = c.result(0, timeout=pg_timeout_s + 20)
            code0, _ = c.wait_exit(0, timeout=EXIT_MAX_S)
        c.send(1, "exit")
        c.result(1, timeout=40)
        code1, _ = c.wait_exit(1, timeout=EXIT_MAX_S)
    report(
        f"{method}() from another thread ended a blocked all_reduce after "
        f"{r0['blocked_s'] - 0.5:.3f}s: {r0['outcome'][:150]!r}"
    )
    # abort() is immediate. shutdown() first gives queued ops a grace of min(timeout, 30 s);
    # the op here is already running, so it ends by the group timeout at the latest.
    limit = 0.5 + (ABORT_MAX_S if method == "abort" else pg_timeout_s + ABORT_MAX_S)
    assert r0["outcome"] != "completed", r0
    assert r0["blocked_s"] <= limit, f"blocked {r0['blocked_s']:.1f}s (limit {limit}s): {r0}"
    assert (code0, code1) == (0, 0), (code0, code1)


def _mismatch_while_waiting_worker(rank: int, world: int, ctl: Control) -> dict[str, Any]:
    """Rank 0 gathers and waits for stopped rank 1 first, asleep on rank 1's socket; rank 2 gathers
    a different size, and its frame on its own socket fails rank 0's op."""
    if not _ready_unless_stopped(rank, ctl):
        return {}
    numel = 1024 if rank == 0 else 2048
    gathered = [torch.empty(numel) for _ in range(world)] if rank == 0 else None
    return _timed_outcome(lambda: dist.gather(torch.ones(numel), gathered, dst=0))


STAGGER_S = 1.0
WAKE_MAX_S = 5.0


def test_failure_seen_on_another_socket_wakes_a_waiting_reader(pycomm: ModuleType) -> None:
    """Over TCP a thread waiting for a short message sleeps in poll() on that peer's socket; an op
    failed by what arrives from another peer must wake it at once, not at the group timeout."""
    pg_timeout_s = 20.0
    with Cluster(
        _mismatch_while_waiting_worker, 3, env={"PYCOMM_TRANSPORT": "tcp"}, pg_timeout_s=pg_timeout_s,
        hang_timeout_s=90,
    ) as c:
        with c.stopped(1):
            c.send(0, "go")
            time.sleep(STAGGER_S)  # rank 0 is asleep in its wait before rank 2's frame comes
            c.send(2, "go")
            r0 = c.result(0, timeout=pg_timeout_s + 20)
            r2 = c.result(2, timeout=pg_timeout_s + 20)
        c.send(1, "exit")
        c.result(1, timeout=40)
    report(f"gather size mismatch seen on rank 2's socket ended rank 0's wait on rank 1 after "
            f"{r0['blocked_s']:.3f}s: {r0['outcome'][:150]!r}")
    assert "rank 2 runs gather of 2048" in r0["outcome"], r0
    # Rank 0 was asleep when rank 2's frame came (it did not fail at once), and woke long before the
    # group timeout (bounds loose enough for a loaded CI machine; without the wake-up it is 20 s).
    assert STAGGER_S / 2 <= r0["blocked_s"] <= STAGGER_S + WAKE_MAX_S, r0
    assert r2["outcome"] != "completed", r2
