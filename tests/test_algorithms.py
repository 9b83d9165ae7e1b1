"""All-reduce algorithms beyond the fixed sweeps of test_collectives (issue 3).

- A group that switches algorithm from one call to the next, with async ops still queued when
  it switches: each call must run the algorithm in force when it was issued (checked in the core's
  INFO log) and still give the reference result.
- 1,000 tensors of mixed sizes and dtypes through every coalesced entry point, with buckets small
  enough that there are many of them.
- World sizes 5 and 6 (not powers of two, above what test_collectives covers) with each algorithm
  forced, up to 4 MiB + 3 elements.

Expected values come from reference.py (float64 for floats, int64 for integers), computed by
every rank from every rank's regenerated input; world sizes 1 to 8 per algorithm are covered
natively in tests/native/test_collectives.cc.
"""

from __future__ import annotations

import contextlib
import faulthandler
import itertools
import math
import os
import random
import re
import signal
import sys
import tempfile
import warnings
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from reference import check_equal, check_reduced, input_for, ops_for, reduced_checker
from support import Failures, assert_no_failures, dtype_feature, reduce_op

ALGORITHMS: tuple[str, ...] = ("ring", "tree", "rhd")
# 4 Mi + 3 elements (16 MiB + 12 bytes of float32): odd for every world size, and many default
# 512-KiB chunks per rank's segment.
LARGE_NUMEL = 4 * 1024 * 1024 + 3


# ---------------------------------------------------------------------------------------------
# Switching algorithm from call to call

SWITCH_CALLS = 60
SWITCH_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16,
                                           torch.float16)
# An async op is left pending across this many later calls (and their set_algorithm) at most.
MAX_PENDING = 4

Call = tuple[str, int, torch.dtype, str, bool]  # algorithm, numel, dtype, op, async_op

# One line per op in the core's INFO log: " seq=7 allreduce 400 B ring tcp sent ...".
_ALLREDUCE_LOG = re.compile(r" seq=\d+ allreduce (\d+) B (\S+) ")


def switch_plan(seed: int, world: int) -> list[Call]:
    """The calls of the switching test: one RNG with one seed, so every rank draws the same plan."""
    rng = random.Random(seed)
    sizes = (0, 1, world - 1, world + 1, 13, 97, 4099, 20011, 40009, 65537)
    plan: list[Call] = []
    for _ in range(SWITCH_CALLS):
        dtype = rng.choice(SWITCH_DTYPES)
        plan.append(
            (
                rng.choice((*ALGORITHMS, "auto")),
                rng.choice(sizes),
                dtype,
                rng.choice(ops_for(dtype)),
                rng.random() < 0.5,
            )
        )
    return plan


@contextlib.contextmanager
def core_log_to(path: str) -> Iterator[None]:
    """Send file descriptor 2, where the C++ core logs, to ``path`` while the block runs.

    The SIGUSR1 stack dump that run_ranks asks for on a hang still goes to the real stderr.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    real_stderr = os.fdopen(saved, "w", closefd=False)
    faulthandler.register(signal.SIGUSR1, file=real_stderr, all_threads=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        real_stderr.close()
        os.close(saved)


def _check_log(f: Failures, plan: list[Call], log: list[str]) -> None:
    """The i-th all-reduce the core logged is the i-th call, with the algorithm asked for."""
    ran = [m.groups() for line in log if (m := _ALLREDUCE_LOG.search(line))]
    if len(ran) != len(plan):
        f.add("core log", f"{len(ran)} all-reduces logged, expected {len(plan)}")
        return
    for k, ((algorithm, numel, dtype, _, _), (nbytes, used)) in enumerate(
        zip(plan, ran, strict=True)
    ):
        expected_bytes = numel * torch.empty((), dtype=dtype).element_size()
        ok = used in ALGORITHMS if algorithm == "auto" else used == algorithm
        f.check(
            f"call {k} log",
            None
            if ok and int(nbytes) == expected_bytes
            else f"ran {used} on {nbytes} B, expected {algorithm} on {expected_bytes} B",
        )


def switch_worker(rank: int, world: int, seed: int) -> tuple[list[str], int]:
    """Every call: set_algorithm, then all_reduce (sync or async) of a random size, dtype and op.

    Async ops are waited for only a few calls later, so set_algorithm is issued while earlier
    all-reduces are still queued: those must keep the algorithm in force when they were issued.
    """
    import pycomm

    f = Failures(rank)
    plan = switch_plan(seed, world)
    pending: list[tuple[str, Any, torch.Tensor, list[torch.Tensor], str]] = []

    def finish_pending() -> None:
        for label, work, t, inputs, op in pending:
            with f.guard(label):
                work.wait()
                f.check(label, check_reduced(t, inputs, op))
        pending.clear()

    fd, log_path = tempfile.mkstemp(prefix=f"pycomm-switch-rank{rank}-", suffix=".log")
    os.close(fd)
    try:
        with core_log_to(log_path):
            for k, (algorithm, numel, dtype, op, async_op) in enumerate(plan):
                label = (
                    f"call {k}: {algorithm} {dtype_feature(dtype)} numel={numel} "
                    f"op={op} async={async_op}"
                )
                inputs = [
                    input_for(seed * 1000 + k, r, (numel,), dtype, op)
                    for r in range(world)
                ]
                t = inputs[rank].clone()
                with f.guard(label):
                    pycomm.set_algorithm(algorithm)
                    work = dist.all_reduce(t, op=reduce_op(op), async_op=async_op)
                    if async_op:
                        pending.append((label, work, t, inputs, op))
                    else:
                        f.check(label, check_reduced(t, inputs, op))
                if len(pending) >= MAX_PENDING:
                    finish_pending()
            finish_pending()
        with open(log_path, encoding="utf-8", errors="replace") as log_file:
            log = log_file.readlines()
    finally:
        os.unlink(log_path)
    # Whatever else was written meanwhile (failures, warnings) belongs on the real stderr.
    sys.stderr.writelines(line for line in log if "[pycomm INFO]" not in line)
    _check_log(f, plan, log)
    return f.result()


def test_plan_switches_between_every_algorithm() -> None:
    """The seeded plans themselves: every algorithm and both sync and async calls occur."""
    for world in (3, 4):
        plan = switch_plan(world, world)
        assert {c[0] for c in plan} == {*ALGORITHMS, "auto"}
        assert {c[4] for c in plan} == {False, True}
        switches = sum(a[0] != b[0] for a, b in itertools.pairwise(plan))
        assert switches >= SWITCH_CALLS // 2


@pytest.mark.parametrize(
    ("world", "chunk_bytes"),
    [pytest.param(3, 4096, id="w3-chunk4096"), pytest.param(4, None, id="w4")],
)
def test_switch_algorithm_every_call(
    pycomm: ModuleType, world: int, chunk_bytes: int | None
) -> None:
    options = pycomm.Options(transport="tcp", chunk_bytes=chunk_bytes, debug="INFO")
    results = run_ranks(
        switch_worker,
        world,
        backend="pycomm",
        timeout_s=120,
        pg_options=options,
        args=(world,),
    )
    assert_no_failures(results)


# ---------------------------------------------------------------------------------------------
# Coalesced all-reduce of 1,000 tensors

COALESCED_TENSORS = 1000
COALESCED_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64, torch.int64, torch.int32, torch.float16,
                                              torch.bfloat16)
# (entry point, op). dist.all_reduce_coalesced is called once per dtype: torch itself rejects a
# mixed-dtype list there (_ensure_all_tensors_same_dtype, for gloo as for pycomm). gloo also
# rejects mixed dtypes in the other two ("tensors must all have the same type"); pycomm accepts
# them, and they get the whole mixed list.
ENTRY_POINTS: tuple[tuple[str, str], ...] = (
    ("all_reduce_coalesced", "sum"),
    ("coalescing_manager", "sum"),
    ("bucketed_all_reduce", "sum"),
    ("bucketed_all_reduce", "max"),
)
SMALL_BUCKET_BYTES = 64 * 1024


def coalesced_specs(seed: int) -> list[tuple[int, torch.dtype]]:
    """(numel, dtype) of the 1,000 tensors: 0 and 1 element of every dtype, the rest log-uniform
    in 0..20,000 elements (mostly small, like a model's parameters), in shuffled order."""
    rng = random.Random(seed)
    specs = [(n, dtype) for dtype in COALESCED_DTYPES for n in (0, 1)]
    while len(specs) < COALESCED_TENSORS:
        numel = int(math.exp(rng.uniform(0.0, math.log(20_001)))) - 1
        specs.append((numel, rng.choice(COALESCED_DTYPES)))
    rng.shuffle(specs)
    return specs


def min_buckets(specs: list[tuple[int, torch.dtype]], bucket_bytes: int) -> int:
    """Fewest buckets of one dtype each that hold ``specs`` without exceeding ``bucket_bytes``
    (a tensor larger than that is a bucket of its own)."""
    total = 0
    for dtype in COALESCED_DTYPES:
        sizes = [
            n * torch.empty((), dtype=dtype).element_size()
            for n, d in specs
            if d == dtype
        ]
        total += sum(1 for b in sizes if b > bucket_bytes)
        total += math.ceil(sum(b for b in sizes if b <= bucket_bytes) / bucket_bytes)
    return total


def _allreduce_calls(pycomm: ModuleType) -> int:
    return int(pycomm.stats().get("allreduce", {}).get("calls", 0))


def coalesced_worker(
    rank: int, world: int, seed: int, bucket_bytes: int | None
) -> tuple[list[str], int]:
    from torch.distributed.distributed_c10d import _coalescing_manager

    import pycomm

    f = Failures(rank)
    specs = coalesced_specs(seed)
    for e, (entry, op) in enumerate(ENTRY_POINTS):
        base = seed * 100_000 + e * COALESCED_TENSORS
        inputs = [
            [
                input_for(base + j, r, (n,), dtype, op)
                for j, (n, dtype) in enumerate(specs)
            ]
            for r in range(world)
        ]
        mine = [t.clone() for t in inputs[rank]]
        label = f"{entry} op={op}"
        with f.guard(label):
            calls_before = _allreduce_calls(pycomm)
            if entry == "all_reduce_coalesced":
                for dtype in COALESCED_DTYPES:
                    same = [t for t in mine if t.dtype == dtype]
                    with warnings.catch_warnings():
                        # torch: "all_reduce_coalesced will be deprecated"
                        warnings.simplefilter("ignore", FutureWarning)
                        dist.all_reduce_coalesced(same, op=reduce_op(op))
            elif entry == "coalescing_manager":
                with _coalescing_manager(async_ops=True) as cm:
                    for t in mine:
                        dist.all_reduce(t, op=reduce_op(op))
                cm.wait()
            else:
                pycomm.bucketed_all_reduce(mine, op=reduce_op(op))
            if bucket_bytes is not None and entry == "bucketed_all_reduce":
                # The small bucket_bytes took effect: at least this many one-dtype buckets.
                calls = _allreduce_calls(pycomm) - calls_before
                least = min_buckets(specs, bucket_bytes)
                f.check(
                    f"{label} buckets",
                    None
                    if calls >= least
                    else f"{calls} all-reduces, expected >= {least}",
                )
        for j, (n, dtype) in enumerate(specs):
            f.check(
                f"{label} tensor[{j}] {dtype_feature(dtype)} numel={n}",
                check_reduced(mine[j], [inputs[r][j] for r in range(world)], op),
            )
    return f.result()


@pytest.mark.parametrize(
    ("world", "bucket_bytes", "transport"),
    [
        pytest.param(3, SMALL_BUCKET_BYTES, "tcp", id="w3-bucket64k-tcp"),
        pytest.param(2, None, None, id="w2-default"),
    ],
)
def test_coalesced_mixed_tensors(
    pycomm: ModuleType, world: int, bucket_bytes: int | None, transport: str | None
) -> None:
    options = pycomm.Options(bucket_bytes=bucket_bytes, transport=transport)
    results = run_ranks(
        coalesced_worker,
        world,
        backend="pycomm",
        timeout_s=180,
        pg_options=options,
        args=(world, bucket_bytes),
    )
    assert_no_failures(results)


# ---------------------------------------------------------------------------------------------
# World sizes 5 and 6, every algorithm, up to 4 MiB + 3 elements


def world_worker(rank: int, world: int) -> tuple[list[str], int]:
    """One TCP group per algorithm (Options(algorithm=...)); each case runs on all of them."""
    import pycomm

    f = Failures(rank)
    groups = {
        algorithm: dist.new_group(
            list(range(world)),
            pg_options=pycomm.Options(algorithm=algorithm, transport="tcp"),
        )
        for algorithm in ALGORITHMS
    }
    small = (0, 1, world - 1, world + 1, 20011)
    cases = [
        *((n, torch.float32, ("sum", "avg", "max")) for n in small),
        *((n, torch.int64, ("sum",)) for n in small),
        (LARGE_NUMEL, torch.float32, ("sum", "avg", "max")),
    ]
    for seed, (numel, dtype, ops) in enumerate(cases, start=1):
        # Float inputs do not depend on the op, so the large ones are generated once for all three.
        inputs = [input_for(seed, r, (numel,), dtype, ops[0]) for r in range(world)]
        for op in ops:
            # One reference per op for the three algorithms: at 4 Mi elements x 6 ranks the
            # float64 reference costs some 20 times the all-reduce itself.
            check = reduced_checker(inputs, op)
            for algorithm, group in groups.items():
                label = f"{algorithm} {dtype_feature(dtype)} numel={numel} op={op}"
                t = inputs[rank].clone()
                with f.guard(label):
                    dist.all_reduce(t, op=reduce_op(op), group=group)
                    f.check(label, check(t))
    return f.result()


@pytest.mark.parametrize("world", [5, 6], ids=lambda w: f"w{w}")
def test_algorithms_world(pycomm: ModuleType, world: int) -> None:
    results = run_ranks(world_worker, world, backend="pycomm", timeout_s=240)
    assert_no_failures(results)


# ---------------------------------------------------------------------------------------------
# Coalesced all-reduce: buckets in place over shared memory, packed into a staging tensor otherwise

def coalesced_views_worker(rank: int, world: int) -> tuple[list[str], int]:
    """bucketed_all_reduce of contiguous tensors mixed with a transposed view, a view at a storage
    offset and a strided view with gaps, all in one float32 bucket: every view's elements reduced,
    the elements around them untouched."""
    import pycomm

    f = Failures(rank)
    bases = {
        name: [input_for(70_000 + k, r, shape, torch.float32, "sum") for r in range(world)]
        for k, (name, shape) in enumerate((("plain", (1009,)), ("transposed", (5, 7)), ("offset", (40,)),
                                           ("strided", (6, 8)), ("empty", (0,)), ("last", (3,))))
    }
    mine = {name: b[rank].clone() for name, b in bases.items()}
    views = {
        "plain": lambda t: t,
        "transposed": lambda t: t.t(),
        "offset": lambda t: t[11:30],
        "strided": lambda t: t[1::2, ::3],
        "empty": lambda t: t,
        "last": lambda t: t,
    }
    with f.guard("bucketed_all_reduce of views"):
        pycomm.bucketed_all_reduce([views[name](t) for name, t in mine.items()])
    for name, view in views.items():
        f.check(f"{name}: the view reduced", check_reduced(view(mine[name]), [view(b) for b in bases[name]], "sum"))
        outside = torch.ones_like(mine[name], dtype=torch.bool)
        view(outside).fill_(False)
        f.check(f"{name}: outside the view untouched", check_equal(mine[name][outside], bases[name][rank][outside]))
    return f.result()


def coalesced_pieces_worker(rank: int, world: int, transport: str) -> tuple[list[str], int]:
    """coalesced_pieces_cases, with the core's log telling which buckets ran in place: over shared
    memory all but the last two, over TCP none."""
    f = Failures(rank)
    fd, log_path = tempfile.mkstemp(prefix=f"pycomm-pieces-rank{rank}-", suffix=".log")
    os.close(fd)
    try:
        with core_log_to(log_path):
            coalesced_pieces_cases(f, rank, world)
        with open(log_path) as log:
            ran = [m.group(2) for line in log if (m := _ALLREDUCE_LOG.search(line))]
    finally:
        os.unlink(log_path)
    in_place = [name.endswith("-in-place") for name in ran]
    expected = [True] * 7 + [False] * 2 if transport == "auto" else [False] * 9
    f.check("buckets run in place", None if in_place == expected else f"logged {ran}")
    return f.result()


def coalesced_pieces_cases(f: Failures, rank: int, world: int) -> None:
    """Buckets that shared memory all-reduces in place, tensor by tensor: a short one (every rank
    reduces everything), one where some ranks' slices lie inside one tensor and another's spans
    two, one of several 1 MiB chunks whose boundaries fall inside tensors, contiguous views at
    storage offsets; and buckets that must be packed first: the same tensor twice and overlapping
    views, both larger than a 1 MiB chunk (in place, a later chunk would re-read results)."""
    import pycomm

    cases = {
        "short": ((1, 17, 0, 300, 2), torch.float32, "sum"),
        "one slice in one tensor": ((200_000, 3), torch.int32, "sum"),
        "chunks across tensors": ((70_001, 5, 300_007, 1, 90_000), torch.float64, "max"),
        "avg": ((3, 100_003, 2), torch.float32, "avg"),
        "premul_sum": ((5, 70_001, 0, 9), torch.float64, "premul_sum"),
        "avg, short": ((7, 11), torch.bfloat16, "avg"),
    }
    for k, (name, (sizes, dtype, op)) in enumerate(cases.items()):
        inputs = [[input_for(80_000 + 10 * k + j, r, (n,), dtype, op) for j, n in enumerate(sizes)]
                  for r in range(world)]
        mine = [t.clone() for t in inputs[rank]]
        with f.guard(name):
            pycomm.bucketed_all_reduce(mine, op=reduce_op(op))
            for j, t in enumerate(mine):
                f.check(f"{name}: tensor {j}", check_reduced(t, [inputs[r][j] for r in range(world)], op))
    bases = [input_for(80_100, r, (60,), torch.float32, "sum") for r in range(world)]
    with f.guard("contiguous views at offsets"):
        t = bases[rank].clone()
        pycomm.bucketed_all_reduce([t[11:30], t[35:]])
        f.check("contiguous views at offsets", check_reduced(t[11:30], [b[11:30] for b in bases], "sum"))
        f.check("contiguous views at offsets", check_reduced(t[35:], [b[35:] for b in bases], "sum"))
        f.check("outside the views untouched", check_equal(t[:11], bases[rank][:11]))
        f.check("outside the views untouched", check_equal(t[30:35], bases[rank][30:35]))
    bases = [input_for(80_200, r, (300_000,), torch.int64, "sum") for r in range(world)]
    with f.guard("the same tensor twice"):
        t = bases[rank].clone()
        pycomm.bucketed_all_reduce([t, t])
        f.check("the same tensor twice", check_reduced(t, bases, "sum"))
    with f.guard("overlapping views"):
        t = bases[rank].clone()
        pycomm.bucketed_all_reduce([t[0:200_000], t[100_000:]])
        f.check("overlapping views", check_reduced(t, bases, "sum"))


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_coalesced_in_pieces(pycomm: ModuleType, transport: str) -> None:
    assert_no_failures(run_ranks(coalesced_pieces_worker, 3, backend="pycomm", timeout_s=120,
                                 pg_options=pycomm.Options(transport=transport, debug="INFO"), args=(transport,)))


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_coalesced_views(pycomm: ModuleType, transport: str) -> None:
    assert_no_failures(run_ranks(coalesced_views_worker, 3, backend="pycomm", timeout_s=120,
                                 pg_options=pycomm.Options(transport=transport)))
