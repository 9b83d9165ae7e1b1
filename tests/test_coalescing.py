"""Coalescing as torch's `_coalescing_manager` and `batch_isend_irecv` use it: the backend says it
supports it, a block of all_gather_into_tensor or reduce_scatter_tensor calls runs as one transfer
schedule per dtype (pycomm.stats() counts one core op, not one per tensor), and every result equals
the float64 / exact reference of the separate calls; batch_isend_irecv hands back one Work for the
whole batch. World 3, odd sizes (0, 1, primes), mixed dtypes."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from mp import run_ranks
from reference import check_equal, check_reduced, input_for
from support import Failures, assert_no_failures

TIMEOUT_S = 90
# (elements per rank, dtype, trailing shape): 0, 1 and primes, a 2-D tensor, several dtypes
SPECS: list[tuple[int, torch.dtype, tuple[int, ...]]] = [
    (0, torch.float32, ()),
    (1, torch.float32, ()),
    (7, torch.int64, ()),
    (1021, torch.float32, ()),
    (13, torch.float32, (3,)),
    (4099, torch.bfloat16, ()),
    (257, torch.int64, ()),
]


def _calls(stats: dict[str, Any], key: str) -> int:
    return int(stats.get(key, {}).get("calls", 0))


def _all_gather_block(f: Failures, rank: int, world: int) -> None:
    from torch.distributed.distributed_c10d import _coalescing_manager

    import pycomm

    inputs = [input_for(100 + k, rank, (n, *tail), dtype, None) for k, (n, dtype, tail) in enumerate(SPECS)]
    outputs = [torch.full((world * n, *tail), -1).to(dtype) for n, dtype, tail in SPECS]
    before = _calls(pycomm.stats(), "allgather")
    with _coalescing_manager(async_ops=True) as cm:
        for out, inp in zip(outputs, inputs):
            dist.all_gather_into_tensor(out, inp)
    cm.wait()
    calls = _calls(pycomm.stats(), "allgather") - before
    f.check("all_gather_into_tensor block: one fused all-gather", None if calls == 1 else f"{calls} all-gathers")
    for k, ((n, dtype, tail), out) in enumerate(zip(SPECS, outputs)):
        expected = torch.cat([input_for(100 + k, r, (n, *tail), dtype, None) for r in range(world)])
        f.check(f"all_gather_into_tensor block tensor {k} ({n} x {tail} {dtype})", check_equal(out, expected))


def _reduce_scatter_block(f: Failures, rank: int, world: int, op: str) -> None:
    from torch.distributed.distributed_c10d import _coalescing_manager

    import pycomm

    specs = [(n, dtype, tail) for n, dtype, tail in SPECS if dtype != torch.bfloat16 or op == "sum"]
    redop = dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX

    def whole(k: int, r: int, n: int, dtype: torch.dtype, tail: tuple[int, ...]) -> torch.Tensor:
        return input_for(200 + k, r, (world * n, *tail), dtype, op)

    inputs = [whole(k, rank, n, dtype, tail) for k, (n, dtype, tail) in enumerate(specs)]
    originals = [t.clone() for t in inputs]
    outputs = [torch.zeros((n, *tail), dtype=dtype) for n, dtype, tail in specs]
    before = _calls(pycomm.stats(), "reduce_scatter")
    with _coalescing_manager(async_ops=True) as cm:
        for out, inp in zip(outputs, inputs):
            dist.reduce_scatter_tensor(out, inp, op=redop)
    cm.wait()
    calls = _calls(pycomm.stats(), "reduce_scatter") - before
    dtypes = len({dtype for _, dtype, _ in specs})
    f.check(
        f"reduce_scatter_tensor block {op}: one fused reduce-scatter per dtype",
        None if calls == dtypes else f"{calls} reduce-scatters for {dtypes} dtypes",
    )
    for k, ((n, dtype, tail), out) in enumerate(zip(specs, outputs)):
        parts = [whole(k, r, n, dtype, tail)[rank * n : (rank + 1) * n] for r in range(world)]
        f.check(f"reduce_scatter_tensor block {op} tensor {k} ({n} x {tail} {dtype})", check_reduced(out, parts, op))
        f.check(f"reduce_scatter_tensor block {op} input {k} unchanged", check_equal(inputs[k], originals[k]))


def _batch_p2p(f: Failures, rank: int, world: int) -> None:
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    sent = [input_for(300 + j, rank, (n,), torch.float32, None) for j, n in enumerate((1, 1021, 65537))]
    got = [torch.zeros_like(t) for t in sent]
    ops = [dist.P2POp(dist.isend, t, nxt) for t in sent] + [dist.P2POp(dist.irecv, t, prv) for t in got]
    works = dist.batch_isend_irecv(ops)
    f.check("batch_isend_irecv: one Work for the batch", None if len(works) == 1 else f"{len(works)} Works")
    for w in works:
        w.wait()
    for j, (n, t) in enumerate(zip((1, 1021, 65537), got)):
        f.check(f"batch_isend_irecv tensor {j}", check_equal(t, input_for(300 + j, prv, (n,), torch.float32, None)))


def coalescing_worker(rank: int, world: int) -> tuple[list[str], int]:
    f = Failures(rank)
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    f.check("supports_coalescing", None if backend.supports_coalescing else "the backend says False")
    with f.guard("all_gather_into_tensor block"):
        _all_gather_block(f, rank, world)
    for op in ("sum", "max"):
        with f.guard(f"reduce_scatter_tensor block {op}"):
            _reduce_scatter_block(f, rank, world, op)
    with f.guard("batch_isend_irecv"):
        _batch_p2p(f, rank, world)
    # The group still works after the blocks.
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    f.check("all_reduce after the blocks", check_equal(t, torch.full((5,), float(world * (world + 1) // 2))))
    return f.result()


def test_coalesced_blocks_fuse_and_match_the_separate_calls() -> None:
    assert_no_failures(run_ranks(coalescing_worker, 3, backend="pycomm", timeout_s=TIMEOUT_S))


def p2p_then_collective_worker(rank: int, world: int) -> tuple[list[str], int]:
    """A batch whose receive completes only after a collective issued behind it: the batch's Work
    must not hold up the group's collectives (gloo runs this; so must pycomm)."""
    f = Failures(rank)
    t = torch.ones(3)
    if rank == 0:
        got = torch.zeros(4)
        works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, 1)])
        dist.all_reduce(t)
        for w in works:
            w.wait()
        f.check("the batch's receive", check_equal(got, torch.arange(4.0)))
    else:
        dist.all_reduce(t)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.arange(4.0), 0)]):
            w.wait()
    f.check("the all_reduce behind the batch", check_equal(t, torch.full((3,), float(world))))
    return f.result()


def test_a_batch_does_not_hold_up_later_collectives() -> None:
    assert_no_failures(
        run_ranks(p2p_then_collective_worker, 2, backend="pycomm", timeout_s=TIMEOUT_S, pg_timeout_s=5, destroy=False)
    )
