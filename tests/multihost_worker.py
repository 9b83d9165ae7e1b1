"""One rank of the multi-host test, run inside a network namespace by test_multihost.py."""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist

import pycomm


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("pycomm", init_method=f"tcp://{args.master}:{args.port}", rank=args.rank,
                            world_size=args.world, pg_options=pycomm.Options(debug="INFO"))
    failures = []
    for count in (0, 1, 13, 4099, 300007):
        inputs = [torch.randn(count, dtype=torch.float64, generator=torch.Generator().manual_seed(1000 * q + count))
                  for q in range(args.world)]
        expected = torch.stack(inputs).sum(0) if count else torch.zeros(0, dtype=torch.float64)
        mine = inputs[args.rank].clone()
        dist.all_reduce(mine)
        if not torch.allclose(mine, expected, rtol=1e-12, atol=1e-12):
            failures.append(f"all_reduce float64 count {count}: max error {(mine - expected).abs().max().item()}")
        ints = torch.arange(count, dtype=torch.int32) * (args.rank + 1)
        dist.all_reduce(ints, op=dist.ReduceOp.MAX)
        if not torch.equal(ints, torch.arange(count, dtype=torch.int32) * args.world):
            failures.append(f"all_reduce int32 max count {count}")
        gathered = torch.empty(count * args.world, dtype=torch.float64)
        dist.all_gather_into_tensor(gathered, inputs[args.rank])
        if count and not torch.equal(gathered, torch.cat(inputs)):
            failures.append(f"all_gather count {count}")
        root = args.world - 1
        b = inputs[args.rank].clone()
        dist.broadcast(b, src=root)
        if not torch.equal(b, inputs[root]):
            failures.append(f"broadcast count {count}")
    dist.barrier()
    dist.destroy_process_group()
    for failure in failures:
        print(f"FAILED rank {args.rank}: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
