"""All-reduce of CUDA tensors at world 2 on one GPU: pycomm's staged path against gloo's.

    python benchmarks/cuda_staged.py [--sizes 4K,1M,64M] [--iters 20] [--reps 5]

Both ranks use cuda:0. Each rep times `iters` all-reduces (issued synchronously, with a device
synchronize before the clock stops); the median rep is reported, as microseconds per call and bus
bandwidth (2(p-1)/p bytes per byte). Every rank checks its last result. Needs a GPU; exits 0 with a
message where torch sees none.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from gpu_ranks import gpu_parser, parse_or_skip, run_ranks


WORLD = 2


def time_backend(group: dist.ProcessGroup, nbytes: int, iters: int, reps: int) -> tuple[float, bool]:
    count = nbytes // 4
    t = torch.ones(count, device="cuda:0")
    for _ in range(3):
        dist.all_reduce(t, group=group)
    times = []
    for _ in range(reps):
        t.fill_(1.0)
        dist.barrier(group=group)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t, group=group)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / iters)
    # After the last rep every element is WORLD**iters.
    ok = bool((t == float(WORLD**iters)).all().item()) if count else True
    return statistics.median(times), ok


def worker(rank: int, port: int, sizes: list[int], iters: int, reps: int, results: Any) -> None:
    import pycomm  # noqa: F401  (registers the backend)

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("pycomm", rank=rank, world_size=WORLD)
    gloo = dist.new_group(backend="gloo")
    rows = []
    for nbytes in sizes:
        mine, ok_mine = time_backend(dist.group.WORLD, nbytes, iters, reps)
        theirs, ok_theirs = time_backend(gloo, nbytes, iters, reps)
        rows.append((nbytes, mine, ok_mine, theirs, ok_theirs))
    if rank == 0:
        results.put(rows)
    dist.destroy_process_group()


def main() -> int:
    parser = gpu_parser(__doc__, sizes="4K,64K,1M,16M,64M", reps=5, port=29671)
    parser.add_argument("--iters", type=int, default=20)
    parsed = parse_or_skip(parser, "cuda_staged")
    if parsed is None:
        return 0
    args, sizes = parsed
    rows, clean = run_ranks(worker, WORLD, (args.port, sizes, args.iters, args.reps), 480)
    if rows is None:
        print("cuda_staged: the ranks failed or took longer than 480 s; nothing measured")
        return 1
    print(f"# all_reduce float32, world {WORLD} on one GPU ({torch.cuda.get_device_name(0)}), "
          f"median of {args.reps} reps x {args.iters} calls")
    print(f"{'bytes':>12} {'pycomm us':>11} {'busbw GB/s':>11} {'gloo us':>11} {'busbw GB/s':>11} "
          f"{'speedup':>8} {'correct':>8}")
    factor = 2 * (WORLD - 1) / WORLD
    failed = False
    for nbytes, mine, ok_mine, theirs, ok_theirs in rows:
        failed |= not ok_mine
        print(f"{nbytes:>12} {mine * 1e6:>11.1f} {factor * nbytes / mine / 1e9:>11.3f} "
              f"{theirs * 1e6:>11.1f} {factor * nbytes / theirs / 1e9:>11.3f} {theirs / mine:>8.2f} "
              f"{'yes' if ok_mine and ok_theirs else 'NO':>8}")
    return 1 if failed or not clean else 0


if __name__ == "__main__":
    sys.exit(main())
