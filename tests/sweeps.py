"""Rank-side sweeps for test_collectives: one function per collective family.

Each sweep loops over dtypes x shapes (x reduce ops, x roots) inside a single
process group, because spawning ranks costs seconds while a small collective
costs microseconds. Expected values always come from reference.py, never from
the backend. Every other case runs with async_op=True and also checks the
value of work.get_future().
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from reference import (
    ALL_DTYPES,
    check_equal,
    check_reduced,
    input_for,
    ops_for,
)
from support import (
    FULL_SWEEP,
    Failures,
    dtype_feature,
    future_tensors,
    future_value,
    gloo_gap,
    reduce_op,
)

Shape = tuple[int, ...]

# 0 and 1 elements are edge cases; 13 does not split evenly over 2..5 ranks
# (and is smaller than some chunkings); 4099 is prime and spans several
# 4-KiB pages; (3, 5, 7) checks that only numel matters.
SHAPES: tuple[Shape, ...] = ((0,), (1,), (13,), (4099,), (3, 5, 7))
FULL_SHAPES: tuple[Shape, ...] = ((65537,), (262147,))
# "Several MiB" (3 MiB of float32): larger than socket buffers and any sane
# chunk size, so pipelining/flow control is exercised. float32 + SUM only.
LARGE: Shape = (786433,)


class GroupOps:
    """``g.all_reduce(...)`` is ``dist.all_reduce(..., group=g.group)``: sweeps run on several groups."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group

    def __getattr__(self, name: str) -> Any:
        return functools.partial(getattr(dist, name), group=self.group)


def shapes() -> tuple[Shape, ...]:
    return SHAPES + FULL_SHAPES if FULL_SWEEP else SHAPES


def reduction_cases(backend: str) -> Iterator[tuple[int, torch.dtype, Shape, str]]:
    """(seed, dtype, shape, op) for every dtype x its ops x shape, plus the large case."""
    seed = 0
    for dtype in ALL_DTYPES:
        for op in ops_for(dtype):
            for shape in shapes():
                seed += 1
                if not gloo_gap(
                    backend, op, dtype_feature(dtype), f"{dtype_feature(dtype)}_{op}"
                ):
                    yield seed, dtype, shape, op
    yield seed + 1, torch.float32, LARGE, "sum"


def movement_cases(backend: str) -> Iterator[tuple[int, torch.dtype, Shape]]:
    """(seed, dtype, shape) for data-movement collectives."""
    seed = 0
    for dtype in ALL_DTYPES:
        for shape in shapes():
            seed += 1
            if not gloo_gap(backend, dtype_feature(dtype)):
                yield seed, dtype, shape
    yield seed + 1, torch.float32, LARGE


def _flat0(t: torch.Tensor, world: int) -> torch.Tensor:
    """View a (world, *shape) tensor as (world * shape[0], *shape[1:]) (torch's usual layout)."""
    return t.reshape(world * t.shape[1], *t.shape[2:])


def _future_equals(f: Failures, label: str, work: object, expected: Sequence[torch.Tensor]) -> None:
    """The future's tensors must be exactly ``expected`` (same count, same bits)."""
    tensors = future_tensors(work)
    if len(tensors) != len(expected):
        f.add(label + " future", f"{len(tensors)} tensors, expected {len(expected)}")
        return
    for k, (got, want) in enumerate(zip(tensors, expected, strict=True)):
        f.check(f"{label} future[{k}]", check_equal(got, want))


def _future_reduces(f: Failures, label: str, work: object, inputs: Sequence[torch.Tensor], op: str) -> None:
    """The future must hold one tensor: the ``op``-reduction of ``inputs``."""
    tensors = future_tensors(work)
    if len(tensors) != 1:
        f.add(label + " future", f"{len(tensors)} tensors, expected 1")
        return
    f.check(label + " future", check_reduced(tensors[0], inputs, op))


def _finish_reduction(
    f: Failures, label: str, work: Any, out: torch.Tensor, inputs: Sequence[torch.Tensor], op: str, check_future: bool
) -> None:
    """Wait for ``work`` (None: the op ran synchronously), check its future where the backend
    fills one, then ``out``: the ``op``-reduction of ``inputs``."""
    if work is not None:
        work.wait()
    if check_future:
        _future_reduces(f, label, work, inputs, op)
    f.check(label, check_reduced(out, inputs, op))


def _check_future_concat(f: Failures, label: str, work: object, expected: torch.Tensor) -> None:
    """For ops with one output tensor, accept [output] or a list of its pieces (gloo's
    choice for all_gather_into_tensor): the concatenated values must match."""
    tensors = future_tensors(work)
    got = (
        torch.cat([t.reshape(-1) for t in tensors])
        if tensors
        else torch.empty(0, dtype=expected.dtype)
    )
    f.check(label + " future", check_equal(got, expected.reshape(-1)))


def sweep_all_reduce(f: Failures, rank: int, world: int, backend: str, g: GroupOps) -> None:
    for seed, dtype, shape, op in reduction_cases(backend):
        label = f"all_reduce {dtype_feature(dtype)} shape={shape} op={op}"
        inputs = [input_for(seed, r, shape, dtype, op) for r in range(world)]
        t = inputs[rank].clone()
        async_op = seed % 2 == 1
        with f.guard(label):
            work = g.all_reduce(t, op=reduce_op(op), async_op=async_op)
            if async_op:
                work.wait()
                _future_reduces(f, label, work, inputs, op)
            f.check(label, check_reduced(t, inputs, op))
    _all_reduce_noncontiguous(f, rank, world, backend, g)


def _all_reduce_noncontiguous(f: Failures, rank: int, world: int, backend: str, g: GroupOps) -> None:
    """In-place all_reduce on views: the view (hence its base) must be updated, nothing else."""
    for k, (dtype, op) in enumerate(
        ((torch.float32, "sum"), (torch.int64, "bxor"), (torch.bfloat16, "max"))
    ):
        seed = 50_000 + 10 * k
        name = dtype_feature(dtype)
        # Transposed: dense memory, permuted strides.
        bases = [input_for(seed, r, (5, 7), dtype, op) for r in range(world)]
        base = bases[rank].clone()
        label = f"all_reduce transposed view {name} op={op}"
        with f.guard(label):
            g.all_reduce(base.t(), op=reduce_op(op))
            f.check(label, check_reduced(base, bases, op))
        # Sliced with a storage offset (contiguous, but data_ptr != storage start).
        bases = [input_for(seed + 1, r, (40,), dtype, op) for r in range(world)]
        base = bases[rank].clone()
        label = f"all_reduce offset view {name} op={op}"
        with f.guard(label):
            g.all_reduce(base[11:30], op=reduce_op(op))
            f.check(label, check_reduced(base[11:30], [b[11:30] for b in bases], op))
            f.check(
                label + " outside view untouched",
                check_equal(base[:11], bases[rank][:11]),
            )
            f.check(
                label + " outside view untouched",
                check_equal(base[30:], bases[rank][30:]),
            )
        if gloo_gap(backend, "strided_inplace"):
            continue
        # Strided with gaps: elements between the strides must not be written.
        bases = [input_for(seed + 2, r, (6, 8), dtype, op) for r in range(world)]
        base = bases[rank].clone()
        label = f"all_reduce strided view {name} op={op}"
        with f.guard(label):
            g.all_reduce(base[1::2, ::3], op=reduce_op(op))
            f.check(
                label, check_reduced(base[1::2, ::3], [b[1::2, ::3] for b in bases], op)
            )
            outside = torch.ones(6, 8, dtype=torch.bool)
            outside[1::2, ::3] = False
            f.check(
                label + " outside view untouched",
                check_equal(base[outside], bases[rank][outside]),
            )


def sweep_reduce(f: Failures, rank: int, world: int, backend: str, g: GroupOps) -> None:
    for seed, dtype, shape, op in reduction_cases(backend):
        root = seed % world
        label = f"reduce {dtype_feature(dtype)} shape={shape} op={op} dst={root}"
        inputs = [input_for(seed, r, shape, dtype, op) for r in range(world)]
        t = inputs[rank].clone()
        async_op = seed % 2 == 1
        with f.guard(label):
            work = g.reduce(t, dst=root, op=reduce_op(op), async_op=async_op)
            if async_op:
                work.wait()
            if rank == root:  # other ranks' buffers are unspecified after reduce
                f.check(label, check_reduced(t, inputs, op))
                if async_op:
                    _future_reduces(f, label, work, inputs, op)
    # Non-contiguous input on every rank (output lands in the root's view).
    if not gloo_gap(backend, "strided_inplace"):
        bases = [
            input_for(60_000, r, (6, 8), torch.float32, "sum") for r in range(world)
        ]
        base = bases[rank].clone()
        root = world - 1
        label = f"reduce strided view float32 dst={root}"
        with f.guard(label):
            g.reduce(base[::2, 1::3], dst=root)
            if rank == root:
                f.check(
                    label,
                    check_reduced(
                        base[::2, 1::3], [b[::2, 1::3] for b in bases], "sum"
                    ),
                )


def sweep_broadcast(f: Failures, rank: int, world: int, backend: str, g: GroupOps) -> None:
    for seed, dtype, shape in movement_cases(backend):
        root = seed % world
        label = f"broadcast {dtype_feature(dtype)} shape={shape} src={root}"
        data = [input_for(seed, r, shape, dtype, None) for r in range(world)]
        t = data[
            rank
        ].clone()  # non-roots start with different data that must be replaced
        async_op = seed % 2 == 1
        with f.guard(label):
            work = g.broadcast(t, src=root, async_op=async_op)
            if async_op:
                work.wait()
                _future_equals(f, label, work, [data[root]])
            f.check(label, check_equal(t, data[root]))
    # Non-contiguous views on both sides.
    for k, dtype in enumerate((torch.float32, torch.int64, torch.bool)):
        seed = 70_000 + 10 * k
        root = k % world
        bases = [input_for(seed, r, (6, 8), dtype, None) for r in range(world)]
        name = dtype_feature(dtype)
        base = bases[rank].clone()
        label = f"broadcast transposed view {name} src={root}"
        with f.guard(label):
            g.broadcast(base.t(), src=root)
            f.check(label, check_equal(base, bases[root]))
        if gloo_gap(backend, "strided_inplace"):
            continue
        base = bases[rank].clone()
        label = f"broadcast strided view {name} src={root}"
        with f.guard(label):
            g.broadcast(base[::2, 1::3], src=root)
            f.check(label, check_equal(base[::2, 1::3], bases[root][::2, 1::3]))
            outside = torch.ones(6, 8, dtype=torch.bool)
            outside[::2, 1::3] = False
            f.check(
                label + " outside view untouched",
                check_equal(base[outside], bases[rank][outside]),
            )


def sweep_all_gather(f: Failures, rank: int, world: int, backend: str, g: GroupOps) -> None:
    """all_gather (list), all_gather_into_tensor (flat and stacked output) and gather."""
    for seed, dtype, shape in movement_cases(backend):
        name = dtype_feature(dtype)
        inputs = [input_for(seed, r, shape, dtype, None) for r in range(world)]
        expected = torch.stack(inputs)
        async_op = seed % 2 == 1

        label = f"all_gather {name} shape={shape}"
        with f.guard(label):
            outs = [torch.empty(shape, dtype=dtype) for _ in range(world)]
            work = g.all_gather(outs, inputs[rank], async_op=async_op)
            if async_op:
                work.wait()
                _future_equals(f, label, work, inputs)
                if not gloo_gap(backend, "all_gather_future_nesting"):
                    value = future_value(work)
                    if not (
                        len(value) == 1
                        and isinstance(value[0], list)
                        and len(value[0]) == world
                    ):
                        f.add(
                            label + " future",
                            f"value is not [[{world} tensors]]: {type(value[0])}",
                        )
            for r in range(world):
                f.check(f"{label} output[{r}]", check_equal(outs[r], inputs[r]))

        stacked = seed % 4 < 2 and not gloo_gap(backend, "into_tensor_stacked")
        label = f"all_gather_into_tensor {name} shape={shape} {'stacked' if stacked else 'flat'}"
        with f.guard(label):
            out = torch.empty((world, *shape), dtype=dtype)
            work = g.all_gather_into_tensor(
                out if stacked else _flat0(out, world), inputs[rank], async_op=async_op
            )
            if async_op:
                work.wait()
                _check_future_concat(f, label, work, expected)
            f.check(label, check_equal(out, expected))

        dst = seed % world
        label = f"gather {name} shape={shape} dst={dst}"
        with f.guard(label):
            outs = (
                [torch.empty(shape, dtype=dtype) for _ in range(world)]
                if rank == dst
                else None
            )
            work = g.gather(inputs[rank], outs, dst=dst, async_op=async_op)
            if async_op:
                work.wait()
            if outs is not None:
                for r in range(world):
                    f.check(f"{label} output[{r}]", check_equal(outs[r], inputs[r]))
                if async_op:
                    _future_equals(f, label, work, inputs)
    # Non-contiguous input.
    bases = [input_for(80_000, r, (6, 8), torch.float32, None) for r in range(world)]
    label = "all_gather strided input float32"
    with f.guard(label):
        outs = [torch.empty(3, 3) for _ in range(world)]
        g.all_gather(outs, bases[rank][::2, ::3])
        for r in range(world):
            f.check(
                f"{label} output[{r}]",
                check_equal(outs[r], bases[r][::2, ::3].contiguous()),
            )


def sweep_scatter(f: Failures, rank: int, world: int, backend: str, g: GroupOps) -> None:
    for seed, dtype, shape in movement_cases(backend):
        src = seed % world
        label = f"scatter {dtype_feature(dtype)} shape={shape} src={src}"
        # Chunk j of the source's list: seeded by rank id world + j so it differs from any input.
        chunks = [input_for(seed, world + j, shape, dtype, None) for j in range(world)]
        out = torch.empty(shape, dtype=dtype)
        async_op = seed % 2 == 1
        with f.guard(label):
            work = g.scatter(
                out,
                [c.clone() for c in chunks] if rank == src else None,
                src=src,
                async_op=async_op,
            )
            if async_op:
                work.wait()
                _future_equals(f, label, work, [chunks[rank]])
            f.check(label, check_equal(out, chunks[rank]))


def sweep_reduce_scatter(f: Failures, rank: int, world: int, backend: str, g: GroupOps) -> None:
    """reduce_scatter (list input) and reduce_scatter_tensor (flat and stacked input)."""
    for seed, dtype, shape, op in reduction_cases(backend):
        name = dtype_feature(dtype)
        fulls = [input_for(seed, r, (world, *shape), dtype, op) for r in range(world)]
        mine = [fulls[r][rank] for r in range(world)]  # what reduces into this rank's output
        async_op = seed % 2 == 1
        check_future = async_op and not gloo_gap(backend, "reduce_scatter_future")

        label = f"reduce_scatter {name} shape={shape} op={op}"
        with f.guard(label):
            out = torch.empty(shape, dtype=dtype)
            work = g.reduce_scatter(
                out,
                [c.clone() for c in fulls[rank].unbind(0)],
                op=reduce_op(op),
                async_op=async_op,
            )
            _finish_reduction(f, label, work if async_op else None, out, mine, op, check_future)

        stacked = seed % 4 < 2 and not gloo_gap(backend, "into_tensor_stacked")
        label = f"reduce_scatter_tensor {name} shape={shape} op={op} {'stacked' if stacked else 'flat'}"
        with f.guard(label):
            out = torch.empty(shape, dtype=dtype)
            inp = fulls[rank].clone()
            work = g.reduce_scatter_tensor(
                out,
                inp if stacked else _flat0(inp, world),
                op=reduce_op(op),
                async_op=async_op,
            )
            _finish_reduction(f, label, work if async_op else None, out, mine, op, check_future)


def _split(src: int, dst: int, salt: int) -> int:
    """Uneven all_to_all segment length from src to dst; includes zeros."""
    return (3 * src + 5 * dst + salt) % 7


def _segments(seed: int, src: int, world: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """What rank ``src`` sends to each rank in the uneven all_to_all case."""
    sizes = [_split(src, dst, seed) for dst in range(world)]
    return list(input_for(seed, src, (sum(sizes),), dtype, None).split(sizes))


def sweep_all_to_all(f: Failures, rank: int, world: int, backend: str, g: GroupOps) -> None:
    """all_to_all_single (equal and uneven splits, and in place) and all_to_all (lists)."""
    for seed, dtype, shape in movement_cases(backend):
        name = dtype_feature(dtype)
        fulls = [input_for(seed, r, (world, *shape), dtype, None) for r in range(world)]
        expected = torch.stack([fulls[r][rank] for r in range(world)])
        async_op = seed % 2 == 1

        label = f"all_to_all_single {name} shape={shape}"
        with f.guard(label):
            out = torch.empty((world, *shape), dtype=dtype)
            work = g.all_to_all_single(
                _flat0(out, world),
                _flat0(fulls[rank].clone(), world),
                async_op=async_op,
            )
            if async_op:
                work.wait()
                _check_future_concat(f, label, work, expected)
            f.check(label, check_equal(out, expected))

        # The output is the input: blocks other ranks still need must not be overwritten.
        label = f"all_to_all_single in place {name} shape={shape}"
        if not gloo_gap(backend, "all_to_all_single_in_place"):
            with f.guard(label):
                both = fulls[rank].clone()
                g.all_to_all_single(_flat0(both, world), _flat0(both, world))
                f.check(label, check_equal(both, expected))

        label = f"all_to_all {name} shape={shape}"
        with f.guard(label):
            outs = [torch.empty(shape, dtype=dtype) for _ in range(world)]
            work = g.all_to_all(
                outs, [c.clone() for c in fulls[rank].unbind(0)], async_op=async_op
            )
            if async_op:
                work.wait()
                _future_equals(f, label, work, list(expected.unbind(0)))
            for r in range(world):
                f.check(f"{label} output[{r}]", check_equal(outs[r], expected[r]))

    # Uneven splits (some empty), once per dtype.
    for k, dtype in enumerate(ALL_DTYPES):
        if gloo_gap(backend, dtype_feature(dtype)):
            continue
        seed = 90_000 + k
        sent = _segments(seed, rank, world, dtype)
        received = [_segments(seed, r, world, dtype)[rank] for r in range(world)]
        label = f"all_to_all_single uneven {dtype_feature(dtype)}"
        with f.guard(label):
            out = torch.empty(sum(t.numel() for t in received), dtype=dtype)
            g.all_to_all_single(
                out,
                torch.cat(sent),
                output_split_sizes=[t.numel() for t in received],
                input_split_sizes=[t.numel() for t in sent],
            )
            f.check(label, check_equal(out, torch.cat(received)))
        label = f"all_to_all uneven {dtype_feature(dtype)}"
        if gloo_gap(backend, "all_to_all_uneven_list"):
            continue
        with f.guard(label):
            outs = [torch.empty_like(t) for t in received]
            g.all_to_all(outs, [t.clone() for t in sent])
            for r in range(world):
                f.check(f"{label} output[{r}]", check_equal(outs[r], received[r]))


def sweep_misc(f: Failures, rank: int, world: int, backend: str, g: GroupOps) -> None:
    """barrier ordering, all_reduce_coalesced, and many outstanding async ops."""
    store = dist.distributed_c10d._get_default_store()
    for late in range(world):
        label = f"barrier with rank {late} late"
        with f.guard(label):
            key = f"barrier-{f.prefix}{late}"
            if rank == late:
                time.sleep(0.2)
                store.set(key, "entered")
            g.barrier()
            # Nobody may leave the barrier before the late rank entered it.
            f.check(
                label,
                None if store.check([key]) else "left barrier before late rank entered",
            )
    label = "barrier async future"
    with f.guard(label):
        work = g.barrier(async_op=True)
        work.wait()
        f.check(
            label, None if work.is_completed() else "work not completed after wait()"
        )

    for k, (dtype, op) in enumerate(
        ((torch.float32, "sum"), (torch.int64, "max"), (torch.float64, "product"))
    ):
        if gloo_gap(backend, op, dtype_feature(dtype)):
            continue
        seed = 100_000 + 10 * k
        shapes_ = [(0,), (1,), (13,), (4099,), (3, 5)]
        inputs = [
            [input_for(seed + j, r, s, dtype, op) for j, s in enumerate(shapes_)]
            for r in range(world)
        ]
        for async_op in (False, True):
            label = (
                f"all_reduce_coalesced {dtype_feature(dtype)} op={op} async={async_op}"
            )
            with f.guard(label):
                mine = [t.clone() for t in inputs[rank]]
                work = g.all_reduce_coalesced(mine, op=reduce_op(op), async_op=async_op)
                if async_op:
                    work.wait()
                for j in range(len(shapes_)):
                    f.check(
                        f"{label} tensor[{j}]",
                        check_reduced(
                            mine[j], [inputs[r][j] for r in range(world)], op
                        ),
                    )

    # Many async ops in flight at once, of different kinds; wait in reverse order.
    label = "outstanding async ops"
    with f.guard(label):
        pending: list[tuple[object, Callable[[], str | None]]] = []
        for j in range(12):
            dtype = (torch.float32, torch.int32, torch.bfloat16)[j % 3]
            shape = ((1,), (4099,), (13,), (70_001,))[j % 4]
            inputs = [
                input_for(200_000 + j, r, shape, dtype, "sum") for r in range(world)
            ]
            t = inputs[rank].clone()
            if j % 2 == 0:
                work = g.all_reduce(t, async_op=True)
                pending.append(
                    (work, lambda t=t, inputs=inputs: check_reduced(t, inputs, "sum"))
                )
            else:
                root = j % world
                work = g.broadcast(t, src=root, async_op=True)
                pending.append(
                    (
                        work,
                        lambda t=t, inputs=inputs, root=root: check_equal(
                            t, inputs[root]
                        ),
                    )
                )
        for j, (work, check) in reversed(list(enumerate(pending))):
            work.wait()  # type: ignore[attr-defined]
            f.check(f"{label} #{j}", check())


SWEEPS: dict[str, Callable[[Failures, int, int, str, GroupOps], None]] = {
    "all_reduce": sweep_all_reduce,
    "reduce": sweep_reduce,
    "broadcast": sweep_broadcast,
    "all_gather": sweep_all_gather,
    "scatter": sweep_scatter,
    "reduce_scatter": sweep_reduce_scatter,
    "all_to_all": sweep_all_to_all,
    "misc": sweep_misc,
}


def collective_worker(
    rank: int, world: int, family: str, backend: str, tcp_pass: bool = True
) -> tuple[list[str], int]:
    """Run one family's sweep on the default group and, for pycomm, on a TCP-only group.

    All test ranks share one host, where pycomm's transport="auto" uses shared
    memory for most collectives; the second pass over a group created with
    transport="tcp" covers the network algorithms in the same spawn.
    """
    f = Failures(rank)
    passes: list[tuple[str, GroupOps]] = [("", GroupOps(None))]
    if backend == "pycomm" and tcp_pass and world > 1:
        import pycomm

        tcp = dist.new_group(
            list(range(world)), pg_options=pycomm.Options(transport="tcp")
        )
        passes.append(("[tcp group] ", GroupOps(tcp)))
    for prefix, g in passes:
        f.prefix = prefix
        SWEEPS[family](f, rank, world, backend, g)
    return f.result()
