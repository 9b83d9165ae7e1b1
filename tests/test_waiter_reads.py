"""Over TCP, the thread waiting for a short message reads it from the socket itself, instead of
the transport's event loop reading it and waking the waiter. These tests check that results stay
exact when ops of every algorithm and point-to-point receives on another thread share the sockets,
that the waiting threads really read (the "transport/socket_by_waiter" counter), and that long
receives stay with the event loop, which keeps receiving while the op reduces. A socket a waiter
drained stays with the waiters for a while (its linger): the next op's messages are read by their
waiters too, and receives that need the loop (polled, or blocked behind sends) still complete."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from reference import check_equal, check_reduced, input_for
from support import Failures, assert_no_failures

TIMEOUT_S = 120
# Element counts around the largest receive a waiter reads (256 KiB), as whole buffers and as the
# world-2 ring's halves: int64 makes 8 KiB ... 80 KiB, 256 KiB and 512 KiB (+- one element).
COUNTS = (0, 1, 2, 1000, 4099, 8191, 8192, 8193, 10007, 32767, 32768, 32769, 65535, 65536, 65537)
LONG_COUNT = 1 << 20  # float32, 4 MiB: every receive of a ring all-reduce is a 512 KiB chunk or more
P2P_ROUNDS = 40


def _received() -> tuple[int, int]:
    import pycomm

    stats = pycomm.stats()
    return int(stats["transport/socket"]["bytes_received"]), int(stats["transport/socket_by_waiter"]["bytes_received"])


def _exchange_on_thread(rank: int, world: int, errors: list[str]) -> None:
    """Ranks 0 and 1 swap short messages on a second thread, on the same sockets the ops use."""
    peer = 1 - rank
    try:
        for k in range(P2P_ROUNDS):
            n = 1 + (k * 37) % 3000
            sent = input_for(900 + k, rank, (n,), torch.int64, None)
            got = torch.full((n,), -1, dtype=torch.int64)
            reqs = [dist.isend(sent, peer, tag=7), dist.irecv(got, peer, tag=7)]
            for r in reqs:
                r.wait()
            message = check_equal(got, input_for(900 + k, peer, (n,), torch.int64, None))
            if message is not None:
                errors.append(f"p2p round {k}: {message}")
    except Exception as e:  # reported by the main thread, which owns the Failures
        errors.append(f"p2p thread raised {type(e).__name__}: {e}")


def _worker(rank: int, world: int) -> tuple[list[str], int, dict[str, int]]:
    import pycomm

    f = Failures(rank)
    total_before, waiter_before = _received()
    p2p_errors: list[str] = []
    p2p = threading.Thread(target=_exchange_on_thread, args=(rank, world, p2p_errors)) if rank < 2 else None
    if p2p is not None:
        p2p.start()
    for a, algorithm in enumerate(("ring", "tree", "rhd")):
        pycomm.set_algorithm(algorithm)
        for k, n in enumerate(COUNTS):
            for op, reduce_op in (("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX)):
                label = f"{algorithm} all_reduce {op} {n}"
                with f.guard(label):
                    seed = 100 * a + 10 * k + (op == "max")
                    t = input_for(seed, rank, (n,), torch.int64, op)
                    dist.all_reduce(t, op=reduce_op)
                    inputs = [input_for(seed, q, (n,), torch.int64, op) for q in range(world)]
                    f.check(label, check_reduced(t, inputs, op))
    if p2p is not None:
        p2p.join(TIMEOUT_S)
        f.check("p2p thread finished", None if not p2p.is_alive() else "still running")
        for message in p2p_errors:
            f.add("p2p on a second thread", message)
    total_short, waiter_short = _received()

    pycomm.set_algorithm("ring")
    label = f"ring all_reduce {LONG_COUNT}"
    with f.guard(label):
        t = input_for(7, rank, (LONG_COUNT,), torch.float32, "sum")
        dist.all_reduce(t)
        inputs = [input_for(7, q, (LONG_COUNT,), torch.float32, "sum") for q in range(world)]
        f.check(label, check_reduced(t, inputs, "sum"))
    total_long, waiter_long = _received()
    failures, checks = f.result()
    return failures, checks, {
        "short_total": total_short - total_before,
        "short_by_waiter": waiter_short - waiter_before,
        "long_total": total_long - total_short,
        "long_by_waiter": waiter_long - waiter_short,
    }


@pytest.mark.usefixtures("pycomm")
@pytest.mark.parametrize("world", [2, 3])
def test_waiters_read_short_messages_and_the_loop_reads_long_ones(pycomm: Any, world: int) -> None:
    # chunk_bytes as the default, set so the environment cannot make the long op's receives short.
    results = run_ranks(_worker, world, backend="pycomm", timeout_s=TIMEOUT_S,
                        pg_options=pycomm.Options(transport="tcp", chunk_bytes=512 * 1024))
    assert_no_failures([(failures, checks) for failures, checks, _ in results])
    for rank, (_, _, got) in enumerate(results):
        # Some short messages arrive while their waiter is elsewhere (the loop takes those), but a
        # waiter that never reads means the path is gone.
        assert 0 < got["short_by_waiter"] <= got["short_total"], (rank, got)
        # The long all-reduce moves at least its reduce-scatter's share into this rank.
        assert got["long_total"] >= 4 * LONG_COUNT * (world - 1) // world, (rank, got)
        assert got["long_by_waiter"] == 0, (rank, got)


def _callback_takes_a_held_lock(rank: int, world: int) -> tuple[list[str], int]:
    """Rank 0 holds a lock while its small all-reduces read the socket to rank 1. The receive it
    posted before arrives while it sleeps, so the event loop reads it, and its callback, on the loop
    thread, waits for the lock. The all-reduces must still read that socket: the callback may not
    run while its thread holds the socket (before, it ran with the peer's receive lock held, and the
    two waited on each other for good)."""
    f = Failures(rank)
    lock = threading.RLock()  # the callback may also run on this thread, inside an all_reduce
    message = input_for(950, 1, (257,), torch.int64, None)
    sync = torch.zeros(1)
    seen: list[str] = []
    if rank == 1:
        dist.all_reduce(sync)  # rank 0 has posted its receive
        dist.send(message, 0, tag=3)
    with lock:
        if rank == 0:
            got = torch.full((257,), -1, dtype=torch.int64)
            work = dist.irecv(got, 1, tag=3)

            def take_lock(fut: Any) -> None:
                with lock:
                    seen.append("ran")

            done = work.get_future().then(take_lock)
            dist.all_reduce(sync)
            time.sleep(0.5)  # nobody on this rank waits for rank 1: the loop reads the message
        for k in range(ROUNDS_UNDER_LOCK):
            label = f"all_reduce {k} with the lock held"
            with f.guard(label):
                t = input_for(960 + k, rank, (1000,), torch.int64, "sum")
                dist.all_reduce(t)
                expected = [input_for(960 + k, q, (1000,), torch.int64, "sum") for q in range(world)]
                f.check(label, check_reduced(t, expected, "sum"))
    if rank == 0:
        done.wait()
        f.check("callback ran", None if seen == ["ran"] else f"callback ran {len(seen)} times")
        f.check("p2p payload", check_equal(got, message))
    return f.result()


ROUNDS_UNDER_LOCK = 50


@pytest.mark.usefixtures("pycomm")
def test_a_callback_may_take_a_lock_the_reading_thread_holds(pycomm: Any) -> None:
    assert_no_failures(run_ranks(_callback_takes_a_held_lock, 2, backend="pycomm", timeout_s=60,
                                 pg_options=pycomm.Options(transport="tcp"), pg_timeout_s=30))


LINGER_OPS = 400
# Longer than any test here runs: what must end a linger at once cannot rely on it running out.
LONG_LINGER_MS = 600_000


def _steady_small_ops(rank: int, world: int) -> tuple[list[str], int, dict[str, int]]:
    """Back-to-back short all-reduces (counted), then a point-to-point receive nobody waits for."""
    import pycomm

    f = Failures(rank)
    total = by_waiter = 0
    for algorithm in ("ring", "rhd"):
        pycomm.set_algorithm(algorithm)
        for _ in range(5):  # the sockets start lingering
            dist.all_reduce(torch.ones(1000, dtype=torch.int64))
        total_before, waiter_before = _received()
        for k in range(LINGER_OPS):
            label = f"{algorithm} all_reduce {k}"
            with f.guard(label):
                t = input_for(1000 + k, rank, (1000,), torch.int64, "sum")
                dist.all_reduce(t)
                if k % 50 == 0:  # the reference costs more than the op; a sample shows a mix-up
                    inputs = [input_for(1000 + k, q, (1000,), torch.int64, "sum") for q in range(world)]
                    f.check(label, check_reduced(t, inputs, "sum"))
        total_after, waiter_after = _received()
        total += total_after - total_before
        by_waiter += waiter_after - waiter_before
    # Rank 0's socket to rank 1 lingers after the ops; rank 0 posts a receive and only polls it, and
    # the ranks line up through gloo, which reads no pycomm socket: posting must end the linger.
    message = input_for(1500, 1, (257,), torch.int64, None)
    side = dist.new_group(backend="gloo")
    if rank == 0:
        got = torch.full((257,), -1, dtype=torch.int64)
        work = dist.irecv(got, 1, tag=5)
        dist.barrier(group=side)  # rank 1 sends after this
        give_up = time.monotonic() + 30
        while not work.is_completed() and time.monotonic() < give_up:
            time.sleep(0.001)
        f.check("polled receive completed", None if work.is_completed() else "not completed after 30 s")
        work.wait()
        f.check("polled receive payload", check_equal(got, message))
    else:
        dist.barrier(group=side)
        if rank == 1:
            dist.send(message, 0, tag=5)
    failures, checks = f.result()
    return failures, checks, {"total": total, "by_waiter": by_waiter}


@pytest.mark.usefixtures("pycomm")
@pytest.mark.parametrize("world", [2, 3])
def test_waiters_read_the_next_ops_messages_too(pycomm: Any, world: int) -> None:
    results = run_ranks(_steady_small_ops, world, backend="pycomm", timeout_s=TIMEOUT_S,
                        pg_options=pycomm.Options(transport="tcp", tcp_linger_ms=LONG_LINGER_MS))
    assert_no_failures([(failures, checks) for failures, checks, _ in results])
    for rank, (_, _, got) in enumerate(results):
        # A socket a waiter drained stays with the waiters between ops, so in a steady stream of ops
        # the loop reads almost nothing; it read about half (54% at world 2) when it took every
        # socket back at once, as the next op's first message usually arrives before its waiter.
        # At world 3 (three ranks on two cores) a descheduled waiter leaves some to the loop: the
        # unchanged 9b9d9b5 build measured 70-71% in 2 of 6 runs here (99.9% otherwise), so 80% was
        # a bound of the machine, not of the design; 65% still fails the 54% of no linger.
        assert got["by_waiter"] >= 0.65 * got["total"] > 0, (rank, got)


CYCLE_COUNT = 4 << 20  # int32, 16 MiB: more than the sockets buffer, so a send ends only once read


def _blocking_sends_in_a_cycle(rank: int, world: int) -> tuple[list[str], int]:
    """Short all-reduces leave the sockets with the waiters; then every rank sends to the next one
    before it receives from the previous one. Each send can end only once its receiver reads,
    while that receiver waits in its own send: a rank stuck in a send must still read."""
    import pycomm

    f = Failures(rank)
    pycomm.set_algorithm("ring")  # each rank's waiter reads the previous rank: the cycle's sockets
    for _ in range(20):
        dist.all_reduce(torch.ones(100))
    for k in range(2):
        label = f"cycle {k}"
        with f.guard(label):
            sent = input_for(1600 + k, rank, (CYCLE_COUNT,), torch.int32, None)
            got = torch.full((CYCLE_COUNT,), -1, dtype=torch.int32)
            dist.send(sent, (rank + 1) % world, tag=k)
            dist.recv(got, (rank - 1) % world, tag=k)
            f.check(label, check_equal(got, input_for(1600 + k, (rank - 1) % world, (CYCLE_COUNT,), torch.int32, None)))
    return f.result()


@pytest.mark.usefixtures("pycomm")
def test_blocking_sends_in_a_cycle_after_short_ops(pycomm: Any) -> None:
    # With a linger that outlasts the group timeout, only the rule that a waiting send ends it saves
    # this from the timeout.
    assert_no_failures(run_ranks(_blocking_sends_in_a_cycle, 3, backend="pycomm", timeout_s=TIMEOUT_S,
                                 pg_options=pycomm.Options(transport="tcp", tcp_linger_ms=LONG_LINGER_MS),
                                 pg_timeout_s=60))
