"""What a collective's Work costs Python, and that the short paths keep c10d's semantics.

Synchronous collectives (async_op=False) that completed on the caller's thread return no Work:
c10d's contract for synchronous ops (ProcessGroupNCCL keeps to it too), since torch's Python
wrappers call wait() only on a Work they were given. A synchronous op that did not complete at
once (queued in a coalesced block) or that failed keeps its Work, so its wait() still waits or
raises, and so does every op while torch's graph-input mode registers Works for wait_tensor.

An async collective's wait() releases the GIL while the op is pending, so other Python threads and
the op's Python callbacks (run on pycomm's worker) go on meanwhile; waiting again, reading the
future, dropping the Work as the last owner of its tensor and a failed op's error twice all behave
as c10d's Work does. Results are integers, checked exactly against sums computed here.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import threading
import time

import pytest
import torch
from mp import run_ranks

TIMEOUT_S = 120
N = 1021  # prime: not divisible by the world size


def _sync_work_worker(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    pg = dist.distributed_c10d._get_default_group()
    out: dict[str, Any] = {}

    t = torch.arange(N, dtype=torch.int64) * (rank + 1)
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    out["allreduce_work"] = type(pg.allreduce([t], opts)).__name__
    out["allreduce"] = t

    b = torch.full((7,), rank, dtype=torch.int64)
    bopts = dist.BroadcastOptions()
    bopts.rootRank = world - 1
    bopts.asyncOp = False
    out["broadcast_work"] = type(pg.broadcast([b], bopts)).__name__
    out["broadcast"] = b

    barrier_opts = dist.BarrierOptions()
    barrier_opts.asyncOp = False
    out["barrier_work"] = type(pg.barrier(barrier_opts)).__name__

    # torch's graph-input mode registers every Work for wait_tensor, which waits on it: a Work each.
    d = torch.full((5,), rank + 2, dtype=torch.int64)
    torch._C._distributed_c10d._set_allow_inflight_collective_as_graph_input(True)
    try:
        out["registered_work"] = pg.allreduce([d], opts) is not None
        torch.ops._c10d_functional.wait_tensor(d)
        dist.all_reduce(d)
        torch.ops._c10d_functional.wait_tensor(d)
    finally:
        torch._C._distributed_c10d._set_allow_inflight_collective_as_graph_input(False)
    out["registered"] = d

    # async_op=True keeps its Work, and the future yields the tensor.
    a = torch.arange(N, dtype=torch.int64) + rank
    work = dist.all_reduce(a, async_op=True)
    out["async_work"] = work is not None
    out["async_future"] = work.get_future().wait()[0]

    # A synchronous op inside a coalesced block goes to the worker (the block's Work covers it): it
    # keeps its Work, whether or not the worker finished it by then.
    cpu = torch.device("cpu")
    c = torch.full((3,), rank + 1, dtype=torch.int64)
    pg._start_coalescing(cpu)
    queued = pg.allreduce([c], opts)
    out["coalesced_work"] = queued is not None
    pg._end_coalescing(cpu).wait()
    if queued is not None:
        queued.wait()
    out["coalesced"] = c

    # A synchronous op that fails (the ranks disagree on its size) keeps its Work: wait() raises.
    if world > 1:
        bad = torch.ones(N + (rank % 2), dtype=torch.int64)
        failed = pg.allreduce([bad], opts)
        out["failed_work"] = failed is not None
        try:
            if failed is not None:
                failed.wait()
            out["failed_error"] = ""
        except Exception as e:  # noqa: BLE001 - the message is the result
            out["failed_error"] = str(e)
    return out


@pytest.mark.parametrize("world", [1, 3])
def test_sync_ops_return_no_work_once_done(pycomm: ModuleType, world: int) -> None:
    results = run_ranks(_sync_work_worker, world, backend="pycomm", timeout_s=TIMEOUT_S, pg_timeout_s=30)
    idx = torch.arange(N, dtype=torch.int64)
    want_allreduce = idx * sum(r + 1 for r in range(world))
    want_async = idx * world + sum(range(world))
    for rank, res in enumerate(results):
        assert res["allreduce_work"] == "NoneType", (rank, res["allreduce_work"])
        assert torch.equal(res["allreduce"], want_allreduce), rank
        assert res["broadcast_work"] == "NoneType", (rank, res["broadcast_work"])
        assert torch.equal(res["broadcast"], torch.full((7,), world - 1, dtype=torch.int64)), rank
        assert res["barrier_work"] == "NoneType", (rank, res["barrier_work"])
        assert res["registered_work"], f"rank {rank}: no Work under torch's graph-input mode"
        want_registered = torch.full((5,), sum(r + 2 for r in range(world)) * world, dtype=torch.int64)
        assert torch.equal(res["registered"], want_registered), rank
        assert res["async_work"], rank
        assert torch.equal(res["async_future"], want_async), rank
        assert res["coalesced_work"], f"rank {rank}: a queued synchronous op lost its Work"
        assert torch.equal(res["coalesced"], torch.full((3,), sum(r + 1 for r in range(world)), dtype=torch.int64))
        if world > 1:
            assert res["failed_work"], f"rank {rank}: a failed synchronous op lost its Work"
            assert "mismatch" in res["failed_error"], (rank, res["failed_error"])


LATE_S = 1.0  # how long the last rank sleeps before its part of the op


def _async_work_worker(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    out: dict[str, Any] = {}
    # The op is not done when wait() is called: the last rank joins LATE_S later. Meanwhile another
    # Python thread counts, and the op's Python callback (run on pycomm's worker when the op
    # completes) needs the GIL: a wait() that kept it would stop the count and never return.
    t = torch.arange(N, dtype=torch.int64) * (rank + 1)
    dist.barrier()  # the ranks start the op within milliseconds of each other but for the late one
    if rank == world - 1:
        time.sleep(LATE_S)
    count = [0]
    stop = threading.Event()

    def counting() -> None:
        while not stop.is_set():
            count[0] += 1

    counter = threading.Thread(target=counting)
    work = dist.all_reduce(t, async_op=True)
    chained = work.get_future().then(lambda f: f.value()[0] * 2)
    counter.start()
    time.sleep(0.01)
    before = count[0]
    out["done_before_wait"] = work.is_completed()
    out["waited"] = work.wait()
    during = count[0] - before
    stop.set()
    counter.join()
    out["count_during_wait"] = during
    out["late_rank"] = rank == world - 1
    out["allreduce"] = t
    out["chained"] = chained.wait()

    # Done already: wait() again, the future, and the Work dropped as the last owner of its tensor.
    out["rewait"] = work.wait()
    out["future"] = work.get_future().value()[0]
    for _ in range(100):
        w = dist.all_reduce(torch.ones(5, dtype=torch.int64), async_op=True)
        w.wait()
        del w
    last = dist.all_reduce(torch.ones(5, dtype=torch.int64), async_op=True)
    last.wait()
    out["last"] = last.get_future().value()[0]
    del last

    # A failed async op (the ranks disagree on its size): wait() raises, done or not.
    if world > 1:
        bad = dist.all_reduce(torch.ones(N + (rank % 2), dtype=torch.int64), async_op=True)
        try:
            bad.wait()
            out["failed_error"] = ""
        except Exception as e:  # noqa: BLE001 - the message is the result
            out["failed_error"] = str(e)
        try:
            bad.wait()
            out["failed_again"] = ""
        except Exception as e:  # noqa: BLE001
            out["failed_again"] = str(e)
    return out


@pytest.mark.parametrize("world", [1, 3])
def test_async_work_wait_releases_gil(pycomm: ModuleType, world: int) -> None:
    results = run_ranks(_async_work_worker, world, backend="pycomm", timeout_s=60, pg_timeout_s=30)
    idx = torch.arange(N, dtype=torch.int64)
    want = idx * sum(r + 1 for r in range(world))
    for rank, res in enumerate(results):
        assert res["waited"] and res["rewait"], rank
        assert torch.equal(res["allreduce"], want), rank
        assert torch.equal(res["chained"], want * 2), rank
        assert torch.equal(res["future"], want), rank
        assert torch.equal(res["last"], torch.full((5,), world, dtype=torch.int64)), rank
        if world > 1 and not res["late_rank"]:
            assert not res["done_before_wait"], f"rank {rank}: the op was done before wait(): nothing tested"
            # About LATE_S of waiting: a thread that counts gets through far more than this.
            assert res["count_during_wait"] > 1000, f"rank {rank}: wait() held the GIL ({res['count_during_wait']})"
        if world > 1:
            assert "mismatch" in res["failed_error"], (rank, res["failed_error"])
            assert "mismatch" in res["failed_again"], (rank, res["failed_again"])
