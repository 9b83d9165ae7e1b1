"""The ranks of a one-GPU benchmark (cuda_staged.py, cuda_nccl.py): spawned processes, rank 0's rows.

    rows, clean = run_ranks(worker, world, (port, sizes, ...), deadline_s)

`worker(rank, *args, results)` runs in a spawned process per rank (CUDA needs spawn, not fork);
rank 0 puts its rows on `results`. `rows` is None when a rank failed or `deadline_s` passed before
rank 0 reported; `clean` says whether every rank then exited with status 0. Ranks still running at
the end are terminated, so a hung benchmark never outlives its deadline by more than a minute.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


def run_ranks(worker: Callable[..., None], world: int, args: tuple[Any, ...],
              deadline_s: float) -> tuple[Any | None, bool]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(rank, *args, results)) for rank in range(world)]
    for p in procs:
        p.start()
    rows = None
    deadline = time.monotonic() + deadline_s
    while rows is None and time.monotonic() < deadline:
        try:
            rows = results.get(timeout=5)
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                break
    for p in procs:
        p.join(timeout=60 if rows is not None else 1)
        if p.is_alive():
            p.terminate()
            p.join(timeout=5)
    return rows, all(p.exitcode == 0 for p in procs)
