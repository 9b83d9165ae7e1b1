"""CUDA collectives over NCCL point-to-point, with pycomm's schedules and kernels.

Needs a CUDA build of pycomm, a GPU and NCCL (torch's CUDA wheels bring it). NCCL refuses two
ranks on one GPU of one host, so on a one-GPU machine every rank sets NCCL_HOSTID to a value of its
own: NCCL then takes the ranks for separate hosts and connects them over its socket transport on
loopback. `cuda_transport="nccl"` makes pycomm use NCCL or fail (it never falls back to staging),
so a passing test ran the NCCL path.

Checks: every dtype and reduce op pycomm reduces, against a float64 reference; float32 SUM bit for
bit against the CPU ring at the same world size (same segments, same order of additions, kernels
bit-identical to the CPU reduction); the tree and rhd (both of its modes: 65537 floats are past its
threshold), and the four codecs' all-reduce (group option and
per-call codec), reduce-scatter and all-gather, bit for bit against their CPU counterparts;
all_gather_into_tensor exactly (also in place, FSDP's pattern) and reduce_scatter_tensor against
the reference and the CPU ring's bits, its input left unchanged; broadcast from every root in
several chunks; all_to_all_single (uneven splits into a strided output, complex64, 1 MiB blocks in place); the caller's stream semantics (an op issued while the stream is still busy reads
the final value); at world 2, ranks running different ops (SUM against AVG, different counts,
different ops) fail with an error naming both. The schedules and the op stamps themselves are also
checked without a GPU (tests/native/test_queued_collectives.cc).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from reference import check_equal, check_reduced, input_for
from support import import_pycomm_or_skip, problem_notes, reduce_op

TIMEOUT_S = 240.0  # seven NCCL communicators per world (ten at world 2), each set up over sockets
PG_TIMEOUT_S = 30.0
MISMATCH_PG_TIMEOUT_S = 5.0  # two of the mismatch cases end in the group's timeout
SIZES = (0, 1, 7, 1021, 65537)
SLEEP_CYCLES = 100_000_000
CHUNK_BYTES = 4096  # broadcasts of the larger sizes go down the chain in many chunks

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CASES = (
    (torch.float32, "sum"), (torch.float32, "avg"), (torch.float32, "max"), (torch.float32, "product"),
    (torch.float64, "min"), (torch.float16, "sum"), (torch.bfloat16, "sum"), (torch.int8, "sum"),
    (torch.uint8, "max"), (torch.int16, "min"), (torch.int32, "sum"), (torch.int64, "band"),
    (torch.int64, "bxor"), (torch.int32, "bor"), (torch.bool, "sum"), (torch.float32, "premul_sum"),
)


def _nccl_worker(rank: int, world: int) -> list[str]:
    dev = torch.device("cuda", 0)
    problems, note = problem_notes()

    import pycomm

    cpu_ring = dist.new_group(
        backend="pycomm", pg_options=pycomm.Options(transport="tcp", algorithm="ring")
    )
    for n in SIZES:
        for dtype, op in CASES:
            inputs = [input_for(11 + n, r, (n,), dtype, op) for r in range(world)]
            t = inputs[rank].to(dev)
            dist.all_reduce(t, op=reduce_op(op))
            note(f"all_reduce {dtype} {op} n={n}", check_reduced(t.cpu(), inputs, op))

        inputs = [input_for(17 + n, r, (n,), torch.float32, "sum") for r in range(world)]
        on_gpu = inputs[rank].to(dev)
        dist.all_reduce(on_gpu)
        on_cpu = inputs[rank].clone()
        dist.all_reduce(on_cpu, group=cpu_ring)
        if not torch.equal(on_gpu.cpu().view(torch.int32), on_cpu.view(torch.int32)):
            problems.append(f"all_reduce float32 n={n}: bits differ from the CPU ring's")

        wide = torch.zeros(2 * n, device=dev)
        wide[::2] = inputs[rank].to(dev)
        dist.all_reduce(wide[::2], op=dist.ReduceOp.AVG)
        note(f"all_reduce strided avg n={n}", check_reduced(wide[::2].cpu(), inputs, "avg"))
        note(f"all_reduce strided n={n} gaps", None if bool((wide[1::2] == 0).all()) else "gaps written")

        for root in range(world):
            b = inputs[rank].to(dev)
            dist.broadcast(b, src=root)
            note(f"broadcast n={n} root {root}", check_equal(b.cpu(), inputs[root]))

    _check_other_schedules(rank, world, dev, cpu_ring, problems)
    _check_alltoall(rank, world, dev, problems)

    # Issued while the caller's stream is still busy writing the input: the op must wait for it.
    x = torch.zeros(1 << 20, device=dev)
    torch.cuda._sleep(SLEEP_CYCLES)
    x.fill_(rank + 1)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    expected = float(sum(range(1, world + 1)))
    if not bool((x == expected).all()):
        problems.append(f"all_reduce after a busy stream: {x[:4].tolist()}, expected {expected}")
    if world == 2:
        _check_mismatches(rank, dev, problems)
    return problems


def _check_alltoall(rank: int, world: int, dev: torch.device, problems: list[str]) -> None:
    """all_to_all_single exactly: uneven splits with empty blocks into a strided 2-D float64 output,
    complex64 (a dtype moved as bytes), and equal 1 MiB splits in place (the input is the output;
    blocks that large go in many NCCL steps, so overwriting one before it is sent would show)."""

    def block(a: int, b: int, rows: int) -> torch.Tensor:  # what rank a sends rank b: only they name it
        first = a * 100_000 + b * 1_000
        return torch.arange(first, first + rows * 3, dtype=torch.float64).view(rows, 3)

    def expect(what: str, got: torch.Tensor, wanted: torch.Tensor) -> None:
        outcome = check_equal(got.cpu(), wanted)
        if outcome:
            problems.append(f"all_to_all_single {what}: {outcome}")

    for salt in (1, 2):
        rows = [[(a * 7 + b * 3 + salt) % 5 for b in range(world)] for a in range(world)]
        send = torch.cat([block(rank, b, rows[rank][b]) for b in range(world)]).to(dev)
        received = [rows[a][rank] for a in range(world)]
        wide = torch.full((sum(received), 6), -1.0, dtype=torch.float64, device=dev)
        out = wide[:, ::2]  # not contiguous
        dist.all_to_all_single(out, send, output_split_sizes=received, input_split_sizes=rows[rank])
        expect(f"uneven salt {salt}", out, torch.cat([block(a, rank, rows[a][rank]) for a in range(world)]))
        expect(f"uneven salt {salt} gaps", wide[:, 1::2], torch.full((sum(received), 3), -1.0, dtype=torch.float64))

    values = torch.arange(world * 7, dtype=torch.float32) + rank * 1_000
    c = torch.complex(values, -values).to(dev)
    got = torch.empty_like(c)
    dist.all_to_all_single(got, c)
    wanted = torch.cat([torch.arange(rank * 7, rank * 7 + 7, dtype=torch.float32) + a * 1_000 for a in range(world)])
    expect("complex64", got, torch.complex(wanted, -wanted))

    each = 1 << 18  # int32 elements: 1 MiB per block
    x = (torch.arange(world * each, dtype=torch.int32) + rank * 10_000_000).to(dev)
    dist.all_to_all_single(x, x)
    expect(
        "in place",
        x,
        torch.cat([torch.arange(rank * each, (rank + 1) * each, dtype=torch.int32) + a * 10_000_000 for a in range(world)]),
    )


def _check_mismatches(rank: int, dev: torch.device, problems: list[str]) -> None:
    """Ranks that run different ops fail naming both, through the op stamps (each case aborts its
    group's communicator, so each has a group of its own). At world 2 each rank's predecessor is the
    other, so both must fail."""
    import pycomm

    def expect_mismatch(what: str, run: Any) -> None:
        group = dist.new_group(
            backend="pycomm",
            timeout=timedelta(seconds=MISMATCH_PG_TIMEOUT_S),
            pg_options=pycomm.Options(cuda_transport="nccl"),
        )
        try:
            run(group)
        except Exception as exc:  # the op's error, whatever torch wraps it in
            for part in ("mismatched collectives", f"but rank {1 - rank} runs"):
                if part not in str(exc):
                    problems.append(f"{what}: the error lacks {part!r}: {exc}")
            return
        problems.append(f"{what}: no error")

    # Same bytes on the wire, so the schedule runs to the end: without the stamps, wrong sums.
    expect_mismatch(
        "SUM against AVG",
        lambda g: dist.all_reduce(
            torch.ones(1031, device=dev), op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.AVG, group=g
        ),
    )
    # Transfers that cannot pair: the op hangs until the timeout, whose error names the cause.
    expect_mismatch(
        "1031 elements against 1032", lambda g: dist.all_reduce(torch.ones(1031 + rank, device=dev), group=g)
    )
    expect_mismatch(
        "all_reduce against broadcast",
        lambda g: dist.all_reduce(torch.ones(64, device=dev), group=g)
        if rank == 0
        else dist.broadcast(torch.ones(64, device=dev), src=0, group=g),
    )


def _check_other_schedules(
    rank: int, world: int, dev: torch.device, cpu_ring: Any, problems: list[str]
) -> None:
    import pycomm

    def pair(**options: Any) -> tuple[Any, Any]:
        on_gpu = dist.new_group(
            backend="pycomm",
            pg_options=pycomm.Options(cuda_transport="nccl", chunk_bytes=CHUNK_BYTES, cuda_chunk_bytes=CHUNK_BYTES, **options),
        )
        on_cpu = dist.new_group(
            backend="pycomm",
            pg_options=pycomm.Options(transport="tcp", chunk_bytes=CHUNK_BYTES, **options),
        )
        return on_gpu, on_cpu

    def same_bits(what: str, gpu: torch.Tensor, cpu: torch.Tensor) -> None:
        if not torch.equal(gpu.cpu().view(torch.int32), cpu.view(torch.int32)):
            problems.append(f"{what}: bits differ from the CPU's")

    groups = {"tree": pair(algorithm="tree"), "rhd": pair(algorithm="rhd")}
    for codec in ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2"):
        groups[codec] = pair(compression=codec)
    for n in SIZES:
        inputs = [input_for(23 + n, r, (n,), torch.float32, "sum") for r in range(world)]
        for name, (on_gpu, on_cpu) in groups.items():
            for op in ("sum", "avg") if name not in ("tree", "rhd") else ("sum",):
                g = inputs[rank].to(dev)
                dist.all_reduce(g, op=reduce_op(op), group=on_gpu)
                c = inputs[rank].clone()
                dist.all_reduce(c, op=reduce_op(op), group=on_cpu)
                same_bits(f"all_reduce {name} {op} n={n}", g, c)
        ints = [input_for(29 + n, r, (n,), torch.int64, "sum") for r in range(world)]
        for name in ("tree", "rhd"):
            t = ints[rank].to(dev)
            dist.all_reduce(t, group=groups[name][0])
            outcome = check_reduced(t.cpu(), ints, "sum")
            if outcome:
                problems.append(f"all_reduce {name} int64 n={n}: {outcome}")

        gathered = torch.full((world, n), -1, dtype=torch.int64, device=dev)
        dist.all_gather_into_tensor(gathered, ints[rank].to(dev))
        for r in range(world):
            outcome = check_equal(gathered[r].cpu(), ints[r])
            if outcome:
                problems.append(f"all_gather_into_tensor n={n} block {r}: {outcome}")

        # FSDP's pattern: the input is this rank's slice of the output.
        flat = torch.full((world * n,), -1, dtype=torch.int64, device=dev)
        flat[rank * n : (rank + 1) * n] = ints[rank].to(dev)
        dist.all_gather_into_tensor(flat, flat[rank * n : (rank + 1) * n])
        outcome = check_equal(flat.cpu(), torch.cat(ints))
        if outcome:
            problems.append(f"all_gather_into_tensor in place n={n}: {outcome}")

        blocks = [input_for(31 + n, r, (world * n,), torch.float32, "sum") for r in range(world)]
        source = blocks[rank].to(dev)
        out = torch.empty(n, device=dev)
        dist.reduce_scatter_tensor(out, source)
        mine = [b[rank * n : (rank + 1) * n] for b in blocks]
        outcome = check_reduced(out.cpu(), mine, "sum")
        if outcome:
            problems.append(f"reduce_scatter_tensor n={n}: {outcome}")
        if not torch.equal(source.cpu(), blocks[rank]):
            problems.append(f"reduce_scatter_tensor n={n}: the input was changed")
        ref = torch.empty(n)
        dist.reduce_scatter_tensor(ref, blocks[rank].clone(), group=cpu_ring)
        same_bits(f"reduce_scatter_tensor n={n}", out, ref)
        # AVG into a strided output, from a 2-D input.
        wide = torch.zeros(2 * n, device=dev)
        dist.reduce_scatter_tensor(wide[::2], source.view(world, n), op=dist.ReduceOp.AVG)
        outcome = check_reduced(wide[::2].cpu(), mine, "avg")
        if outcome or not bool((wide[1::2] == 0).all()):
            problems.append(f"reduce_scatter_tensor strided avg n={n}: {outcome or 'gaps written'}")
        for codec in ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2"):
            on_gpu, on_cpu = groups[codec]
            for op in ("sum", "avg"):
                g, c = torch.empty(n, device=dev), torch.empty(n)
                dist.reduce_scatter_tensor(g, source, op=reduce_op(op), group=on_gpu)
                dist.reduce_scatter_tensor(c, blocks[rank].clone(), op=reduce_op(op), group=on_cpu)
                same_bits(f"reduce_scatter_tensor {codec} {op} n={n}", g, c)
            g = torch.empty(world * n, device=dev)
            g[rank * n : (rank + 1) * n] = inputs[rank].to(dev)
            dist.all_gather_into_tensor(g, g[rank * n : (rank + 1) * n], group=on_gpu)
            c = torch.empty(world * n)
            dist.all_gather_into_tensor(c, inputs[rank].clone(), group=on_cpu)
            same_bits(f"all_gather_into_tensor {codec} n={n}", g, c)
            # The per-call codec (what pycomm's DDP hooks use) on the default group, over NCCL.
            g, c = inputs[rank].to(dev), inputs[rank].clone()
            pycomm.all_reduce(g, op=dist.ReduceOp.AVG, compression=codec)
            pycomm.all_reduce(c, op=dist.ReduceOp.AVG, compression=codec, group=on_cpu)
            same_bits(f"pycomm.all_reduce compression={codec} n={n}", g, c)
        maxed = torch.empty(n, dtype=torch.int32, device=dev)
        int_blocks = [input_for(37 + n, r, (world * n,), torch.int32, "max") for r in range(world)]
        dist.reduce_scatter_tensor(maxed, int_blocks[rank].to(dev), op=dist.ReduceOp.MAX)
        outcome = check_reduced(maxed.cpu(), [b[rank * n : (rank + 1) * n] for b in int_blocks], "max")
        if outcome:
            problems.append(f"reduce_scatter_tensor int32 max n={n}: {outcome}")


def _spawn(world: int) -> list[Any]:
    pycomm = import_pycomm_or_skip("pytest tests/test_cuda_nccl.py")
    if not pycomm.cuda_available():
        pytest.skip("pycomm was built without CUDA")
    return run_ranks(
        _nccl_rank,
        world,
        backend="pycomm",
        timeout_s=TIMEOUT_S,
        pg_timeout_s=PG_TIMEOUT_S,
        pg_options=pycomm.Options(cuda_transport="nccl", chunk_bytes=CHUNK_BYTES, cuda_chunk_bytes=CHUNK_BYTES),
    )


def _nccl_rank(rank: int, world: int) -> list[str]:
    # Read by NCCL at its first call, which comes after this: pycomm sets NCCL up at the first
    # CUDA collective.
    os.environ["NCCL_HOSTID"] = f"pycomm-test-rank-{rank}"
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_IB_DISABLE", "1")
    return _nccl_worker(rank, world)


@needs_gpu
@pytest.mark.parametrize("world", [2, 3])
def test_nccl_collectives(world: int) -> None:
    results = _spawn(world)
    problems = [p for per_rank in results for p in per_rank]
    assert not problems, "\n".join(problems[:40])
