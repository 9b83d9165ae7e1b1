"""One small descriptor per collective: sizing, buffers, busbw, call, check.

Sizes follow nccl-tests: ``size_bytes`` is the larger of what one rank sends
and receives (so for all_gather it is the gathered output, i.e. per-rank
input * world; for reduce_scatter the per-rank input), and ``count`` is the
element count nccl-tests prints (the count argument of the NCCL call: the
per-rank shard for all_gather/reduce_scatter/alltoall). algbw = size / time
and busbw = algbw * factor(world), so numbers compare with nccl-tests'.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pycomm.bench import data

# torch 2.13 marks all_gather_into_tensor / reduce_scatter_tensor deprecated in
# favour of *_single, which they forward to unchanged. We call the classic
# names (what pycomm's tests use) and silence the once-per-process warning.
warnings.filterwarnings("ignore", category=FutureWarning, message=r".*all_gather_into_tensor.*")
warnings.filterwarnings("ignore", category=FutureWarning, message=r".*reduce_scatter_tensor.*")

ROOT = 0  # group rank used as root by broadcast and reduce


@dataclass(frozen=True)
class Layout:
    """Element counts for one size of one op on one rank."""

    size_bytes: int  # nccl-tests "size"
    count: int  # nccl-tests "count"
    in_count: int
    out_count: int


@dataclass
class Buffers:
    inp: torch.Tensor
    out: torch.Tensor  # the same tensor as ``inp`` for in-place ops
    pristine: torch.Tensor | None  # timing data restored before each rep

    def reset(self) -> None:
        # In-place reductions grow their input every iteration (x*world per
        # all_reduce); restoring between reps keeps each rep on the same data.
        if self.pristine is not None:
            self.inp.copy_(self.pristine)


class Collective:
    """Base descriptor. Subclasses set the class attributes and override
    ``run`` and ``expected``; the rest is shared."""

    name: str = ""
    in_place: bool = False
    mutates_input: bool = False  # input must be restored between reps
    shards: bool = False  # input or output is split in ``world`` chunks

    def busbw_factor(self, world: int) -> float:
        # A rank of a sharded op moves the world - 1 shards that are not its own (nccl-tests).
        return (world - 1) / world if self.shards else 1.0

    def layout(self, size_bytes: int, elem_size: int, world: int) -> Layout | None:
        """Round the requested size down to what the op can do; None if 0."""
        elems = size_bytes // elem_size
        if self.shards:
            shard = elems // world
            if shard == 0:
                return None
            return self._shard_layout(shard, elem_size, world)
        if elems == 0:
            return None
        return Layout(elems * elem_size, elems, elems, elems)

    def _shard_layout(self, shard: int, elem_size: int, world: int) -> Layout:
        full = shard * world
        return Layout(full * elem_size, shard, full, full)

    def make_buffers(self, layout: Layout, pool: torch.Tensor) -> Buffers:
        """``pool`` holds at least ``in_count`` random elements of the dtype."""
        pristine = pool[: layout.in_count]
        inp = pristine.clone()
        out = inp if self.in_place else torch.empty(layout.out_count, dtype=pool.dtype)
        return Buffers(inp, out, pristine if self.mutates_input else None)

    def run(self, bufs: Buffers, group: dist.ProcessGroup, rank: int, world: int) -> None:
        raise NotImplementedError

    def fill_check(self, bufs: Buffers, layout: Layout, rank: int, period: int) -> None:
        """Known input; output zeroed so unwritten elements count as wrong."""
        bufs.inp.copy_(data.pattern(rank, 0, layout.in_count, period))
        if bufs.out is not bufs.inp:
            bufs.out.zero_()

    def expected(self, layout: Layout, rank: int, world: int, period: int) -> torch.Tensor | None:
        """Exact expected ``bufs.out`` on ``rank``; None where undefined."""
        raise NotImplementedError


class AllReduce(Collective):
    name = "all_reduce"
    in_place = True
    mutates_input = True

    def busbw_factor(self, world: int) -> float:
        return 2.0 * (world - 1) / world

    def run(self, bufs: Buffers, group: dist.ProcessGroup, rank: int, world: int) -> None:
        dist.all_reduce(bufs.inp, op=dist.ReduceOp.SUM, group=group)

    def expected(self, layout: Layout, rank: int, world: int, period: int) -> torch.Tensor | None:
        return data.reduced_pattern(world, 0, layout.in_count, period)


class AllGather(Collective):
    name = "all_gather"
    shards = True

    def _shard_layout(self, shard: int, elem_size: int, world: int) -> Layout:
        return Layout(shard * world * elem_size, shard, shard, shard * world)

    def run(self, bufs: Buffers, group: dist.ProcessGroup, rank: int, world: int) -> None:
        dist.all_gather_into_tensor(bufs.out, bufs.inp, group=group)

    def fill_check(self, bufs: Buffers, layout: Layout, rank: int, period: int) -> None:
        # Each rank's shard is the slice it owns of one global pattern, so the
        # gathered output is a contiguous pattern run per rank.
        bufs.inp.copy_(data.pattern(rank, rank * layout.in_count, layout.in_count, period))
        bufs.out.zero_()

    def expected(self, layout: Layout, rank: int, world: int, period: int) -> torch.Tensor | None:
        shard = layout.in_count
        return torch.cat([data.pattern(r, r * shard, shard, period) for r in range(world)])


class ReduceScatter(Collective):
    name = "reduce_scatter"
    shards = True

    def _shard_layout(self, shard: int, elem_size: int, world: int) -> Layout:
        return Layout(shard * world * elem_size, shard, shard * world, shard)

    def run(self, bufs: Buffers, group: dist.ProcessGroup, rank: int, world: int) -> None:
        dist.reduce_scatter_tensor(bufs.out, bufs.inp, op=dist.ReduceOp.SUM, group=group)

    def expected(self, layout: Layout, rank: int, world: int, period: int) -> torch.Tensor | None:
        shard = layout.out_count
        return data.reduced_pattern(world, rank * shard, shard, period)


class AllToAll(Collective):
    name = "alltoall"
    shards = True

    def run(self, bufs: Buffers, group: dist.ProcessGroup, rank: int, world: int) -> None:
        dist.all_to_all_single(bufs.out, bufs.inp, group=group)

    def expected(self, layout: Layout, rank: int, world: int, period: int) -> torch.Tensor | None:
        # Chunk j of rank r's output is chunk r of rank j's input.
        chunk = layout.count
        return torch.cat([data.pattern(j, rank * chunk, chunk, period) for j in range(world)])


class Broadcast(Collective):
    name = "broadcast"
    in_place = True  # non-roots are overwritten with root data: no growth

    def run(self, bufs: Buffers, group: dist.ProcessGroup, rank: int, world: int) -> None:
        dist.broadcast(bufs.inp, group=group, group_src=ROOT)

    def fill_check(self, bufs: Buffers, layout: Layout, rank: int, period: int) -> None:
        if rank == ROOT:
            bufs.inp.copy_(data.pattern(ROOT, 0, layout.in_count, period))
        else:
            bufs.inp.zero_()

    def expected(self, layout: Layout, rank: int, world: int, period: int) -> torch.Tensor | None:
        return data.pattern(ROOT, 0, layout.in_count, period)


class Reduce(Collective):
    name = "reduce"
    in_place = True
    mutates_input = True

    def run(self, bufs: Buffers, group: dist.ProcessGroup, rank: int, world: int) -> None:
        dist.reduce(bufs.inp, op=dist.ReduceOp.SUM, group=group, group_dst=ROOT)

    def expected(self, layout: Layout, rank: int, world: int, period: int) -> torch.Tensor | None:
        # torch leaves non-root buffers unspecified after reduce.
        if rank != ROOT:
            return None
        return data.reduced_pattern(world, 0, layout.in_count, period)


class SendRecv(Collective):
    """Ring exchange: every rank sends to rank+1 and receives from rank-1."""

    name = "sendrecv"

    def run(self, bufs: Buffers, group: dist.ProcessGroup, rank: int, world: int) -> None:
        ops = [
            dist.P2POp(dist.isend, bufs.inp, group=group, group_peer=(rank + 1) % world),
            dist.P2POp(dist.irecv, bufs.out, group=group, group_peer=(rank - 1) % world),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    def expected(self, layout: Layout, rank: int, world: int, period: int) -> torch.Tensor | None:
        return data.pattern((rank - 1) % world, 0, layout.in_count, period)


# Order here is the order of ``--op all`` and of the report.
COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        AllReduce(),
        AllGather(),
        ReduceScatter(),
        Broadcast(),
        Reduce(),
        AllToAll(),
        SendRecv(),
    )
}
