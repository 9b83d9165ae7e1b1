"""What a collective's Work costs Python, and that the short paths keep c10d's semantics.

Synchronous collectives (async_op=False) that completed on the caller's thread return no Work:
c10d's contract for synchronous ops (ProcessGroupNCCL keeps to it too), since torch's Python
wrappers call wait() only on a Work they were given. A synchronous op that did not complete at
once (queued in a coalesced block) or that failed keeps its Work, so its wait() still waits or
raises.

Results are integers, checked exactly against sums computed here.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

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

    # Through torch's own wrapper, which skips wait() on no Work.
    d = torch.full((5,), rank + 2, dtype=torch.int64)
    out["dist_return"] = type(dist.all_reduce(d)).__name__
    out["dist"] = d

    # async_op=True keeps its Work, and the future yields the tensor.
    a = torch.arange(N, dtype=torch.int64) + rank
    work = dist.all_reduce(a, async_op=True)
    out["async_work"] = work is not None
    out["async_future"] = work.get_future().wait()[0]

    # A synchronous op inside a coalesced block is queued until the block ends: its Work stays.
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
        assert res["dist_return"] == "NoneType", (rank, res["dist_return"])
        assert torch.equal(res["dist"], torch.full((5,), sum(r + 2 for r in range(world)), dtype=torch.int64))
        assert res["async_work"], rank
        assert torch.equal(res["async_future"], want_async), rank
        assert res["coalesced_work"], f"rank {rank}: a queued synchronous op lost its Work"
        assert torch.equal(res["coalesced"], torch.full((3,), sum(r + 1 for r in range(world)), dtype=torch.int64))
        if world > 1:
            assert res["failed_work"], f"rank {rank}: a failed synchronous op lost its Work"
            assert "mismatch" in res["failed_error"], (rank, res["failed_error"])

