"""The ranks of a one-GPU benchmark (cuda_staged.py, cuda_nccl.py): spawned processes, rank 0's rows.

    parser = gpu_parser(__doc__, sizes="4K,1M", reps=3, port=29671)  # then the benchmark's own options
    parsed = parse_or_skip(parser, "cuda_x")  # None: no GPU here, and it said so
    rows, clean = run_ranks(worker, world, (port, sizes, ...), deadline_s)

`worker(rank, *args, results)` runs in a spawned process per rank (CUDA needs spawn, not fork);
rank 0 puts its rows on `results`. `rows` is None when a rank failed or `deadline_s` passed before
rank 0 reported; `clean` says whether every rank then exited with status 0. Ranks still running at
the end are terminated, so a hung benchmark never outlives its deadline by more than a minute.
"""

from __future__ import annotations

import argparse
import queue
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from pycomm.bench.sizes import parse_size


def gpu_parser(doc: str, sizes: str, reps: int, port: int) -> argparse.ArgumentParser:
    """The options every GPU benchmark has: --sizes, --reps and the rendezvous --port."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--sizes", default=sizes)
    parser.add_argument("--reps", type=int, default=reps)
    parser.add_argument("--port", type=int, default=port)
    return parser


def parse_or_skip(parser: argparse.ArgumentParser, prog: str) -> tuple[argparse.Namespace, list[int]] | None:
    """The parsed options and sizes in bytes; None, said on stdout, where torch sees no GPU."""
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"{prog}: no GPU visible to torch; nothing measured")
        return None
    return args, [parse_size(s) for s in args.sizes.split(",")]


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
