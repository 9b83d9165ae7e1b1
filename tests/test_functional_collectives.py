"""torch's functional collectives on pycomm, at world 3 (odd); the monitored barrier has its own file
(test_monitored_barrier.py).

The functional collectives (``torch.distributed._functional_collectives``: what DTensor, FSDP2
and compiled programs issue) reach the backend through the ``_c10d_functional`` ops rather than
``dist.*``; their results are checked against float64 references built from every rank's
deterministic input, and bit for bit against the eager ``dist`` calls on the same group. A
``torch.compile``d function of all three matches the same function run eagerly, bit for bit. Its
backend is "aot_eager": the graph holds the collectives (traced and run through AOT autograd)
without inductor's C++ compile, which took 112 s per rank at world 3 on 2 loaded cores (cold
cache) against about 5 s for aot_eager.

Tolerances: a float32 reduction may differ from the float64 one by 1e-5 of the sum of the
magnitudes it adds (reference.rel_tol); data movement and the eager comparisons are exact.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from mp import run_ranks
from reference import check_equal, input_for, reduced_checker
from support import problem_notes

WORLD = 3
TIMEOUT_S = 90

# (shape, dtype, op): odd element counts, one element, an empty tensor, an integer dtype.
ALL_REDUCE_CASES = [
    ((1,), torch.float32, "sum"),
    ((1031,), torch.float32, "sum"),
    ((5, 13), torch.float32, "avg"),
    ((3, 1, 11), torch.float32, "max"),
    ((0,), torch.float32, "sum"),
    ((257,), torch.float64, "sum"),
    ((17, 3), torch.int32, "sum"),
]
# (shape, dtype, gather_dim): gathers along a later dim are chunked and concatenated by torch.
ALL_GATHER_CASES = [
    ((1,), torch.float32, 0),
    ((5, 13), torch.float32, 0),
    ((5, 13), torch.float32, 1),
    ((2, 3, 7), torch.int64, 2),
]
# (shape, dtype, op, scatter_dim): the scattered dim is a multiple of WORLD, the others odd.
REDUCE_SCATTER_CASES = [
    ((3,), torch.float32, "sum", 0),
    ((3 * 5, 7), torch.float32, "sum", 0),
    ((3 * 7, 5), torch.float32, "avg", 0),
    ((7, 3 * 3), torch.float32, "sum", 1),
    ((3 * 11,), torch.int32, "max", 0),
]
_EAGER_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX}


def _inputs(seed: int, shape: tuple[int, ...], dtype: torch.dtype, op: str | None) -> list[torch.Tensor]:
    return [input_for(seed, r, shape, dtype, op) for r in range(WORLD)]


def _waited(t: torch.Tensor) -> torch.Tensor:
    """A functional collective's result, its collective completed (outside a graph it is an
    AsyncCollectiveTensor that waits on first use)."""
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


def _world() -> dist.ProcessGroup:
    group = dist.group.WORLD
    assert group is not None, "no default group"
    return group


def _all_reduce_checks(rank: int, note: Callable[[str, str | None], None]) -> None:
    group = _world()
    for seed, (shape, dtype, op) in enumerate(ALL_REDUCE_CASES):
        what = f"all_reduce {op} {dtype} {shape}"
        inputs = _inputs(seed, shape, dtype, op)
        functional = _waited(funcol.all_reduce(inputs[rank], op, group))
        note(f"{what} vs float64", reduced_checker(inputs, op)(functional))
        note(f"{what}: input changed", check_equal(inputs[rank], _inputs(seed, shape, dtype, op)[rank]))
        eager = inputs[rank].clone()
        dist.all_reduce(eager, op=_EAGER_OPS[op])
        note(f"{what} vs dist.all_reduce", check_equal(functional, eager))


def _all_gather_checks(rank: int, note: Callable[[str, str | None], None]) -> None:
    group = _world()
    for seed, (shape, dtype, dim) in enumerate(ALL_GATHER_CASES, start=100):
        what = f"all_gather_tensor {dtype} {shape} dim {dim}"
        inputs = _inputs(seed, shape, dtype, None)
        functional = _waited(funcol.all_gather_tensor(inputs[rank], dim, group))
        note(what, check_equal(functional, torch.cat(inputs, dim=dim)))
        if dim == 0:
            eager = torch.empty((WORLD * shape[0], *shape[1:]), dtype=dtype)
            dist.all_gather_into_tensor(eager, inputs[rank])
            note(f"{what} vs dist.all_gather_into_tensor", check_equal(functional, eager))


def _reduce_scatter_checks(rank: int, note: Callable[[str, str | None], None]) -> None:
    group = _world()
    for seed, (shape, dtype, op, dim) in enumerate(REDUCE_SCATTER_CASES, start=200):
        what = f"reduce_scatter_tensor {op} {dtype} {shape} dim {dim}"
        inputs = _inputs(seed, shape, dtype, op)
        functional = _waited(funcol.reduce_scatter_tensor(inputs[rank], op, dim, group))
        own_chunks = [x.chunk(WORLD, dim=dim)[rank] for x in inputs]  # what this rank receives
        note(f"{what} vs float64", reduced_checker(own_chunks, op)(functional))
        if dim == 0:
            eager = torch.empty((shape[0] // WORLD, *shape[1:]), dtype=dtype)
            dist.reduce_scatter_tensor(eager, inputs[rank].clone(), op=_EAGER_OPS[op])
            note(f"{what} vs dist.reduce_scatter_tensor", check_equal(functional, eager))


def _functional_worker(rank: int, world: int) -> list[str]:
    problems, note = problem_notes()
    _all_reduce_checks(rank, note)
    _all_gather_checks(rank, note)
    _reduce_scatter_checks(rank, note)
    return problems


def test_functional_collectives(pycomm: object) -> None:
    per_rank = run_ranks(_functional_worker, WORLD, backend="pycomm", timeout_s=TIMEOUT_S)
    failures = [f"rank {rank}: {p}" for rank, problems in enumerate(per_rank) for p in problems]
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------- torch.compile
COMPILED_ROWS = 7  # rows per rank after the reduce-scatter; odd


def _step(x: torch.Tensor) -> torch.Tensor:
    """All three collectives, chained: all-reduce, gather every rank's copy, reduce-scatter."""
    group = _world()
    summed = funcol.all_reduce(x * 2, "sum", group)
    gathered = funcol.all_gather_tensor(summed + 1, 0, group)
    scattered = funcol.reduce_scatter_tensor(gathered, "sum", 0, group)
    return torch.sin(scattered) + summed


def _step_reference(inputs: list[torch.Tensor]) -> torch.Tensor:
    """_step in float64: every rank gathers the same sum, so each scattered block is WORLD times it."""
    summed = 2 * torch.stack([x.double() for x in inputs]).sum(0)
    return torch.sin(WORLD * (summed + 1)) + summed


# |float32 _step - float64 _step|: the doubled sum of 3 normal values (|s| < 8 here) is off by a
# few ulps of 8 (9.5e-7 each), and sin(3 (s + 1)) triples that. Measured: 1.2e-6.
COMPILED_REFERENCE_TOL = 1e-5


def _compiled_worker(rank: int, world: int) -> dict[str, Any]:
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(_step, backend=counter, fullgraph=True)
    inputs = [input_for(300, r, (COMPILED_ROWS, 5), torch.float32, "sum") for r in range(WORLD)]
    start = time.monotonic()
    first = compiled(inputs[rank])
    compile_s = time.monotonic() - start
    again = compiled(inputs[rank])  # the cached graph
    eager = _waited(_step(inputs[rank]))
    reference = _step_reference(inputs)
    # The ops the graph calls: funcol's functions trace into torch.ops._c10d_functional.*.
    targets = {str(node.target) for graph in counter.graphs for node in graph.graph.nodes}
    return {
        "frames": counter.frame_count,
        "collectives": sorted(t.removeprefix("_c10d_functional.") for t in targets if t.startswith("_c10d_functional.")),
        "vs eager": check_equal(first, eager),
        "again vs eager": check_equal(again, eager),
        "vs float64": float((eager.double() - reference).abs().max()),
        "compile_s": compile_s,
    }


def test_compiled_functional_collectives(pycomm: object) -> None:
    results = run_ranks(_compiled_worker, WORLD, backend="pycomm", timeout_s=TIMEOUT_S)
    for rank, result in enumerate(results):
        assert result["frames"] == 1, f"rank {rank}: {result['frames']} compiled frames (a graph break?)"
        assert result["collectives"] == ["all_gather_into_tensor", "all_reduce", "reduce_scatter_tensor", "wait_tensor"], (
            f"rank {rank}: the graph holds only {result['collectives']}"
        )
        assert result["vs eager"] is None, f"rank {rank}: compiled vs eager: {result['vs eager']}"
        assert result["again vs eager"] is None, f"rank {rank}: second call vs eager: {result['again vs eager']}"
        assert result["vs float64"] <= COMPILED_REFERENCE_TOL, f"rank {rank}: eager vs float64: {result['vs float64']}"
    print(f"[functional] aot_eager compile + first call: {max(r['compile_s'] for r in results):.1f} s (slowest rank)")
