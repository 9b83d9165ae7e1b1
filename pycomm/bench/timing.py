"""Warm-up, iteration-count agreement and the timed loop.

Every collective here must be entered by all ranks the same number of times,
so anything that decides a count (the iteration count) is decided on rank 0
and shared over the control group; no rank acts on its own clock alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from pycomm.bench.backends import one_line


def warmup(call: Callable[[], None], iters: int) -> None:
    """Untimed calls: connection setup, allocation, caches."""
    for _ in range(iters):
        call()


def calibrate(
    call: Callable[[], None], target: float, max_iters: int, control: dist.ProcessGroup
) -> tuple[float, str | None]:
    """Seconds per call, measured like timeit's autorange: batches of 1, 2,
    4, ... calls until one batch takes >= ``target`` on rank 0.

    Averaging whole batches makes the estimate reflect the mean call,
    scheduler stalls included; a few single-call samples on a busy host give
    estimates off by 10x and with them iteration counts too small to
    amortise the start of each rep. After each batch the ranks agree (one
    MAX all-reduce) on rank 0's verdict and on any local failure, so every
    rank makes the same calls. Returns (seconds per call, error or None).
    """
    rank = dist.get_rank(control)
    batch = 1
    while True:
        error: str | None = None
        start = time.perf_counter()
        try:
            for _ in range(batch):
                call()
        except Exception as exc:  # agreed below, reported as an error row
            error = one_line(exc)
        elapsed = time.perf_counter() - start
        done = elapsed >= target or batch >= max_iters
        # [rank 0's elapsed, rank 0's verdict, anyone failed]: MAX of zeros
        # elsewhere broadcasts rank 0's values along with the failure flag.
        state = torch.tensor(
            [elapsed if rank == 0 else 0.0, float(done) if rank == 0 else 0.0, float(error is not None)],
            dtype=torch.float64,
        )
        dist.all_reduce(state, op=dist.ReduceOp.MAX, group=control)
        if state[2].item():
            return 0.0, error or "failed on another rank"
        if state[1].item():
            return state[0].item() / batch, None
        batch *= 2


def iters_for(seconds_per_call: float, per_rep_target: float, max_iters: int) -> int:
    return max(1, min(max_iters, round(per_rep_target / max(seconds_per_call, 1e-9))))


def timed_rep(call: Callable[[], None], iters: int, control: dist.ProcessGroup, prime: bool = True) -> float:
    """One repetition: barrier, one untimed call, then ``iters`` timed calls.

    The untimed ``prime`` call lines the ranks up on the measured group itself
    and wakes its threads, idle since the previous rep ran another variant:
    that wake-up (up to a scheduler tick on a busy host) is an artefact of
    interleaving, not a property of the backend. It is skipped for calls long
    enough to dwarf it, where it would double the cost of the sweep. All the
    collectives here are synchronous on CPU (they wait for completion), so
    the clock stops when the last call finished on this rank.
    """
    dist.barrier(group=control)
    if prime:
        call()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    return time.perf_counter() - start


def max_over_ranks(values: torch.Tensor, control: dist.ProcessGroup) -> torch.Tensor:
    """Element-wise max across ranks: a rep is as slow as its slowest rank."""
    out = values.clone()
    dist.all_reduce(out, op=dist.ReduceOp.MAX, group=control)
    return out
