"""One rank of the multi-host test, run inside a network namespace by test_multihost.py."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import pycomm
from host_rank import join_group


# Relative L2 error of a compressed all-reduce against the float64 sum (the DDP hooks' bounds).
BOUNDS = {"fp16": 1e-3, "fp8_e4m3": 4.5e-2}


def check_compressed(rank: int, world: int) -> list[str]:
    """Compressed all-reduce, reduce-scatter and all-gather: hierarchical with several ranks a host;
    every rank ends with the same bits, near the float64 reference."""
    failures = []
    for codec, bound in BOUNDS.items():
        group = dist.new_group(backend="pycomm", pg_options=pycomm.Options(compression=codec, debug="INFO"))
        for count in (0, 1, 257, 300007):
            inputs = [torch.randn(count, generator=torch.Generator().manual_seed(7 * q + count)) for q in range(world)]
            exact = torch.stack(inputs).double().sum(0) / world
            mine = inputs[rank].clone()
            pycomm.all_reduce(mine, op=dist.ReduceOp.AVG, compression=codec)
            everyone = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(everyone, mine)
            if any(not torch.equal(other.view(torch.int32), mine.view(torch.int32)) for other in everyone):
                failures.append(f"compressed all_reduce {codec} count {count}: ranks differ")
            if count > 1:
                error = ((mine.double() - exact).norm() / exact.norm()).item()
                if error > bound:
                    failures.append(f"compressed all_reduce {codec} count {count}: relative error {error}")
            # reduce_scatter_tensor and all_gather_into_tensor on a group whose Options compress.
            m = count // world
            rs_inputs = [torch.randn(world * m, generator=torch.Generator().manual_seed(11 * q + count))
                         for q in range(world)]
            out = torch.empty(m)
            dist.reduce_scatter_tensor(out, rs_inputs[rank], group=group)
            expect = torch.stack(rs_inputs).double().sum(0).view(world, m)[rank]
            if m > 1 and ((out.double() - expect).norm() / expect.norm()).item() > bound:
                failures.append(f"compressed reduce_scatter {codec} count {count}")
            gathered = torch.empty(world * m)
            dist.all_gather_into_tensor(gathered, out, group=group)
            plain = torch.empty(world * m)
            dist.all_gather_into_tensor(plain, out)
            if m > 1 and ((gathered - plain).norm() / plain.norm()).item() > bound:
                failures.append(f"compressed all_gather {codec} count {count}")
        dist.destroy_process_group(group)
    return failures


def main() -> int:
    args = join_group(pg_options=pycomm.Options(debug="INFO"))
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
    failures += check_compressed(args.rank, args.world)
    dist.barrier()
    dist.destroy_process_group()
    for failure in failures:
        print(f"FAILED rank {args.rank}: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
