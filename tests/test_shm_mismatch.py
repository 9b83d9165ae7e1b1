"""Mismatched collectives on a group whose ranks share memory, and the transport they agree on.

A shared-memory collective never touches a socket, so a peer that runs an op of another path
(one carried by frames: reduce, gather, scatter, all-to-all, a compressed all-reduce) used to
leave both sides waiting for the whole timeout. Now each rank states its op in the segment
before it runs it, and whichever rank comes second sees the difference: every rank raises within
a second, naming both ops. And the ranks leave shared memory for the sockets only at an op they
all agree on, so a failure that some ranks saw and others did not cannot split the group.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from support import store_barrier as _store_barrier

PG_TIMEOUT_S = 20.0  # an error that only came from the timeout is told apart
MISMATCH_MAX_S = 1.0  # the bound: every rank raises within a second

# other op -> the name its signature gives it in messages
OTHER_OPS = {
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "all_to_all_single": "alltoall",
    "all_to_all": "alltoall",
    "compressed_all_reduce": "compressed as fp16",
    "send_then_gather": "gather",  # a point-to-point frame first, through the same rings
}


def _other_op(case: str, rank: int, world: int) -> None:
    import pycomm

    n = 1000
    if case == "reduce":
        dist.reduce(torch.ones(n), dst=0)
    elif case == "gather":
        dist.gather(torch.ones(n), [torch.empty(n) for _ in range(world)] if rank == 0 else None, dst=0)
    elif case == "scatter":
        dist.scatter(torch.empty(n), [torch.ones(n) for _ in range(world)] if rank == 0 else None, src=0)
    elif case == "all_to_all_single":
        dist.all_to_all_single(torch.empty(n * world), torch.ones(n * world))
    elif case == "all_to_all":
        dist.all_to_all([torch.empty(n) for _ in range(world)], [torch.ones(n) for _ in range(world)])
    elif case == "compressed_all_reduce":
        pycomm.all_reduce(torch.ones(n), compression="fp16")
    elif case == "send_then_gather":
        peer = 0 if rank != 0 else 1
        dist.send(torch.ones(8), dst=peer, tag=7) if rank != 0 else dist.recv(torch.empty(8), src=peer, tag=7)
        dist.gather(torch.ones(n), [torch.empty(n) for _ in range(world)] if rank == 0 else None, dst=0)
    else:
        raise AssertionError(case)


def _checked_all_reduce(rank: int, world: int) -> dict[str, Any]:
    t = torch.arange(4099, dtype=torch.int64) * (rank + 1)
    start = time.monotonic()
    try:
        dist.all_reduce(t)
    except Exception as exc:  # noqa: BLE001
        return {"outcome": f"raised {type(exc).__name__}: {exc}", "elapsed": time.monotonic() - start}
    ok = torch.equal(t, torch.arange(4099, dtype=torch.int64) * (world * (world + 1) // 2))
    return {"outcome": "ok" if ok else "wrong result", "elapsed": time.monotonic() - start}


def _shm_vs_other_worker(rank: int, world: int, case: str, late: int) -> dict[str, Any]:
    """The last rank runs `case`, the others an all_reduce (shared memory); rank `late` starts
    0.2 s after the others. Then two all_reduces on every rank."""
    _store_barrier(f"{case}/{late}/before", world)
    if rank == late:
        time.sleep(0.2)
    res: dict[str, Any] = {"error": None}
    start = time.monotonic()
    try:
        if rank == world - 1:
            _other_op(case, rank, world)
        else:
            dist.all_reduce(torch.ones(1000))
    except Exception as exc:  # noqa: BLE001
        res["error"] = f"{type(exc).__name__}: {exc}"
    res["elapsed"] = time.monotonic() - start
    _store_barrier(f"{case}/{late}/after", world)
    res["first"] = _checked_all_reduce(rank, world)
    res["second"] = _checked_all_reduce(rank, world)
    return res


@pytest.mark.parametrize("late", ["shm_first", "other_first"])
@pytest.mark.parametrize("case", list(OTHER_OPS))
def test_shared_memory_op_against_an_op_of_another_path(pycomm: ModuleType, case: str, late: str) -> None:
    world = 2
    late_rank = world - 1 if late == "shm_first" else 0
    results = run_ranks(
        _shm_vs_other_worker, world, backend="pycomm", timeout_s=120, pg_timeout_s=PG_TIMEOUT_S,
        args=(case, late_rank),
    )
    print(
        f"[hardening] shared memory vs {case} ({late}): raised after "
        + ", ".join(f"rank {r} {res['elapsed'] * 1000:.1f} ms" for r, res in enumerate(results))
    )
    problems = []
    for rank, res in enumerate(results):
        err = res["error"]
        mine = OTHER_OPS[case] if rank == world - 1 else "allreduce"
        if err is None:
            problems.append(f"rank {rank}: no error")
        elif res["elapsed"] > MISMATCH_MAX_S + 0.2:
            problems.append(f"rank {rank}: raised after {res['elapsed']:.2f}s: {err[:300]}")
        elif "mismatched" not in err or "allreduce" not in err or OTHER_OPS[case] not in err:
            problems.append(f"rank {rank} ({mine}): message does not say 'mismatched' and name both ops: {err[:400]}")
        if res["second"]["outcome"] != "ok" or res["second"]["elapsed"] > 2.0:
            problems.append(f"rank {rank}: the second all_reduce after the mismatch: {res['second']}")
    assert not problems, f"{case}, {late}:\n" + "\n".join(problems)


def _late_failure_worker(rank: int, world: int) -> dict[str, Any]:
    """Rank 2 expects 2 rows from rank 0, which sends it 1: only rank 2 sees the mismatch, the
    others hear of it later, as a failure of an op that completed for them."""
    n = 3
    inp = torch.arange(n, dtype=torch.float32) + 10 * rank
    res: dict[str, Any] = {}
    try:
        if rank == 2:
            dist.all_to_all_single(torch.empty(4), inp, [2, 1, 1], [1, 1, 1])
        else:
            dist.all_to_all_single(torch.empty(3), inp)
        res["alltoall"] = "ok"
    except Exception as exc:  # noqa: BLE001
        res["alltoall"] = f"{type(exc).__name__}: {exc}"
    time.sleep(0.3)  # the failure report reaches ranks 0 and 1 before their next op
    res["first"] = _checked_all_reduce(rank, world)
    res["second"] = _checked_all_reduce(rank, world)
    return res


def test_a_failure_seen_by_some_ranks_does_not_split_the_transport(pycomm: ModuleType) -> None:
    results = run_ranks(_late_failure_worker, 3, backend="pycomm", timeout_s=120, pg_timeout_s=PG_TIMEOUT_S)
    problems = [
        f"rank {rank}: the second all_reduce: {res['second']} (alltoall: {res['alltoall']}, first: {res['first']})"
        for rank, res in enumerate(results)
        if res["second"]["outcome"] != "ok" or res["second"]["elapsed"] > 2.0
    ]
    assert "mismatched" in results[2]["alltoall"], results[2]
    assert not problems, "\n".join(problems)


def _rejected_shm_op_worker(rank: int, world: int) -> dict[str, Any]:
    """Rank 0's all_gather is rejected by its own input check (a wrong-length output list) while
    the peers run theirs in shared memory; then every rank goes on at once."""
    n = 1000
    res: dict[str, Any] = {}
    outs = [torch.empty(n) for _ in range(world + (1 if rank == 0 else 0))]
    start = time.monotonic()
    try:
        dist.all_gather(outs, torch.ones(n))
        res["gather"] = "ok"
    except Exception as exc:  # noqa: BLE001
        res["gather"] = f"{type(exc).__name__}: {exc}"
    res["gather_elapsed"] = time.monotonic() - start
    res["first"] = _checked_all_reduce(rank, world)
    res["second"] = _checked_all_reduce(rank, world)
    return res


def test_an_op_rejected_on_one_rank_while_the_others_run_it_in_shared_memory(pycomm: ModuleType) -> None:
    results = run_ranks(_rejected_shm_op_worker, 3, backend="pycomm", timeout_s=120, pg_timeout_s=PG_TIMEOUT_S)
    assert results[0]["gather"].startswith("ValueError"), results[0]
    problems = [
        f"rank {rank}: {res}"
        for rank, res in enumerate(results)
        if res["gather"] == "ok" or res["gather_elapsed"] > 2.0 or res["second"]["outcome"] != "ok"
    ]
    assert not problems, "\n".join(problems)
