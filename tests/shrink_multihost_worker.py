"""One rank of test_shrink_multihost: 2 namespace hosts x 2 ranks; rank 3 (host 1) SIGKILLs itself
in the middle of an all-reduce loop; the survivors shrink the group without it and check a
hierarchical all-reduce on the shrunk group (2 ranks on host 0, 1 on host 1) exactly.

Prints one line, "SHRUNK <new rank> <new size> <failed ranks> <ms from the error to the first op>",
and exits 0 on success; rank 0 serves the store (tcp:// init), so it is never the one killed."""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import pycomm
from host_rank import join_group

DOOMED = 3


def main() -> int:
    args = join_group(timeout=datetime.timedelta(seconds=20))
    t = torch.empty(100_000)
    try:
        for i in range(10_000):
            t.fill_(args.rank + 1)
            dist.all_reduce(t)
            if t[0].item() != sum(r + 1 for r in range(args.world)):
                print(f"FAILED rank {args.rank}: wrong all_reduce before the kill", file=sys.stderr)
                return 1
            if args.rank == DOOMED and i == 20:
                os.kill(os.getpid(), signal.SIGKILL)
        print(f"FAILED rank {args.rank}: no error after rank {DOOMED} was killed", file=sys.stderr)
        return 1
    except RuntimeError:
        caught = time.perf_counter()
    lost = pycomm.failed_ranks()
    dist.shrink_group(lost)
    survivors = [r for r in range(args.world) if r not in lost]
    x = torch.arange(300_007, dtype=torch.int64) * (args.rank + 1)
    dist.all_reduce(x)
    first_op_ms = (time.perf_counter() - caught) * 1000
    if not torch.equal(x, torch.arange(300_007, dtype=torch.int64) * sum(r + 1 for r in survivors)):
        print(f"FAILED rank {args.rank}: wrong all_reduce on the shrunk group", file=sys.stderr)
        return 1
    print(f"SHRUNK {dist.get_rank()} {dist.get_world_size()} {lost} {first_op_ms:.0f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
