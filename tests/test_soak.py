"""Soak: thousands of random collectives at world 4, every result checked, memory and fds flat.

Every rank draws the same plan from one seeded RNG: the op, the group (the default group, which
uses shared memory as all ranks share this host, or a second group forced onto TCP), sizes
(mostly 0..64K elements, some up to 1M), dtype, reduce op, root, all_reduce algorithm (through
``pycomm.set_algorithm``) and compression (through ``pycomm.all_reduce``). Each rank rebuilds every
rank's input from (seed, step, rank) and checks its result against a float64 / int64 reference
computed locally (tests/reference.py): exact for integers and data movement, a rounding bound for
floats, and for compressed all-reduces a relative L2 error bound over the whole vector (fp16 1e-3,
bf16 8e-3, fp8_e4m3 4.5e-2, fp8_e5m2 9e-2) when it has at least 1024 elements.

After a warm-up that runs every kind of op at its largest size on both groups, each rank samples
its RSS (/proc/self/statm) and its number of open fds (/proc/self/fd) every ``SAMPLE_EVERY``
collectives: RSS must stay within 10% of the first sample and the fd count must not change. The
RSS is read right after ``malloc_trim(0)``: with random sizes, glibc keeps freed memory cached in
its per-thread arenas (the raw RSS swings by +-40% between samples without any leak), so the
trimmed figure is the one that shows a leak; the raw one is printed too. pycomm.stats() call
counts must equal the collectives issued per group and op.

PYCOMM_SOAK_OPS sets the number of random collectives (default ``DEFAULT_OPS`` = 10,000, about
90 s on a 2-core machine); PYCOMM_SOAK_SEED changes the plan. See docs/RELIABILITY.md.
"""

from __future__ import annotations

import ctypes
import math
import os
import random
import sys
import time
import warnings
from collections import Counter
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from reference import check_equal, check_reduced, input_for
from support import reduce_op

WORLD = 4
DEFAULT_OPS = 10_000  # ~70 s of collectives (~90 s in all) on a 2-core machine
SEED = int(os.environ.get("PYCOMM_SOAK_SEED", "20261129"))
SAMPLE_EVERY = 100
RSS_GROWTH_LIMIT = 0.10
MAX_REPORTED_WRONG = 20

# Relative L2 error bounds of a compressed all-reduce (>= 1024 elements), from the brief.
COMPRESSION_L2_BOUND = {"fp16": 1e-3, "bf16": 8e-3, "fp8_e4m3": 4.5e-2, "fp8_e5m2": 9e-2}
COMPRESSION_MIN_ELEMENTS = 1024

KINDS = (
    ("all_reduce", 28),
    ("all_reduce_compressed", 12),
    ("broadcast", 12),
    ("all_gather_into_tensor", 12),
    ("reduce_scatter_tensor", 12),
    ("all_to_all_single", 12),
    ("reduce", 12),
)
DTYPES = (
    (torch.float32, 30),
    (torch.float64, 10),
    (torch.float16, 10),
    (torch.bfloat16, 10),
    (torch.int64, 10),
    (torch.int32, 10),
    (torch.int16, 5),
    (torch.int8, 5),
    (torch.uint8, 5),
    (torch.bool, 5),  # data movement only
)
FLOAT_OPS = ("sum", "avg", "product", "min", "max")
INT_OPS = ("sum", "product", "min", "max", "band", "bor", "bxor")
ALGORITHMS = ("auto", "ring", "tree", "rhd")
CODECS = tuple(COMPRESSION_L2_BOUND)
# pycomm.stats() key of each op kind (compressed: "allreduce/<codec>")
STATS_KEY = {
    "all_reduce": "allreduce",
    "broadcast": "broadcast",
    "all_gather_into_tensor": "allgather",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all_single": "alltoall",
    "reduce": "reduce",
}


@pytest.fixture(autouse=True)
def _spawned_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks started by mp.run_ranks are fresh interpreters ("spawn"), unless
    PYCOMM_TEST_START_METHOD asks otherwise (e.g. forkserver, for quicker local iterations)."""
    if "PYCOMM_TEST_START_METHOD" not in os.environ:
        monkeypatch.setenv("PYCOMM_TEST_START_METHOD", "spawn")


def _pick(rng: random.Random, weighted: tuple[tuple[Any, int], ...]) -> Any:
    return rng.choices([v for v, _ in weighted], weights=[w for _, w in weighted])[0]


def _size(rng: random.Random, cap: int) -> int:
    """Mostly log-uniform in 0..64K elements; 2% up to ``cap`` (1M for one-buffer ops)."""
    roll = rng.random()
    if roll < 0.02:
        return rng.randint(65_536, cap)
    if roll < 0.10:
        return rng.randint(0, 16)
    return int(math.exp(rng.uniform(0.0, math.log(65_537)))) - 1


def plan_step(rng: random.Random, world: int) -> dict[str, Any]:
    """One random collective; the same on every rank (same rng state)."""
    kind = _pick(rng, KINDS)
    step: dict[str, Any] = {"kind": kind, "group": rng.choice(("auto", "tcp"))}
    if kind == "all_reduce_compressed":
        step.update(
            dtype=torch.float32,
            op=rng.choice(("sum", "avg")),
            codec=rng.choice(CODECS),
            algorithm=rng.choice(ALGORITHMS),
            n=_size(rng, 1 << 20),
        )
        return step
    dtype = _pick(rng, DTYPES)
    reduces = kind in ("all_reduce", "reduce_scatter_tensor", "reduce")
    while reduces and dtype == torch.bool:
        dtype = _pick(rng, DTYPES)
    step["dtype"] = dtype
    if reduces:
        step["op"] = rng.choice(FLOAT_OPS if dtype.is_floating_point else INT_OPS)
    if kind == "all_reduce":
        step["algorithm"] = rng.choice(ALGORITHMS)
    if kind in ("broadcast", "reduce"):
        step["root"] = rng.randrange(world)
    per_rank = kind in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")
    step["n"] = _size(rng, (1 << 20) // world if per_rank else 1 << 20)
    if kind == "all_to_all_single" and rng.random() < 0.5:
        # uneven: splits[j][r] = elements rank j sends to rank r
        step["splits"] = [[rng.randint(0, step["n"]) for _ in range(world)] for _ in range(world)]
    return step


def _warmup_steps(world: int) -> list[dict[str, Any]]:
    """Every op kind at its largest size on both groups: the allocator's high-water mark."""
    steps = []
    for group in ("auto", "tcp"):
        big = 1 << 20
        steps += [
            {"kind": "all_reduce", "group": group, "dtype": torch.float64, "op": "sum", "algorithm": a,
             "n": big}
            for a in ALGORITHMS
        ]
        steps += [
            {"kind": "all_reduce_compressed", "group": group, "dtype": torch.float32, "op": "sum",
             "codec": c, "algorithm": "auto", "n": big}
            for c in CODECS
        ]
        steps += [
            {"kind": "broadcast", "group": group, "dtype": torch.float64, "root": 1, "n": big},
            {"kind": "reduce", "group": group, "dtype": torch.float64, "op": "sum", "root": 2, "n": big},
            {"kind": "all_gather_into_tensor", "group": group, "dtype": torch.float64, "n": big // world},
            {"kind": "reduce_scatter_tensor", "group": group, "dtype": torch.float64, "op": "sum",
             "n": big // world},
            {"kind": "all_to_all_single", "group": group, "dtype": torch.float64, "n": big // world},
            {"kind": "all_to_all_single", "group": group, "dtype": torch.float64, "n": big // world,
             "splits": [[big // world] * world for _ in range(world)]},
        ]
    return steps


def _describe(step: dict[str, Any]) -> str:
    parts = [f"{k}={v}" for k, v in step.items() if k != "splits"]
    if "splits" in step:
        parts.append("uneven splits")
    return " ".join(parts)


def _inputs(seed: int, index: int, step: dict[str, Any], world: int, shape_of: Any) -> list[torch.Tensor]:
    case_seed = seed * 1_000_003 + index
    op = step.get("op")
    return [input_for(case_seed, r, shape_of(r), step["dtype"], op) for r in range(world)]


def _check_compressed(result: torch.Tensor, inputs: list[torch.Tensor], op: str, codec: str) -> str | None:
    stacked = torch.stack([x.to(torch.float64) for x in inputs])
    ref = stacked.sum(0)
    scale = stacked.abs().sum(0)
    if op == "avg":
        ref, scale = ref / len(inputs), scale / len(inputs)
    got = result.to(torch.float64)
    if not bool(torch.isfinite(got).all()):
        return "non-finite values"
    if ref.numel() == 0:
        return None
    bound = COMPRESSION_L2_BOUND[codec]
    err = float((got - ref).norm())
    if ref.numel() >= COMPRESSION_MIN_ELEMENTS:
        rel = err / max(float(ref.norm()), 1e-30)
        return None if rel <= bound else f"relative L2 error {rel:.3e} > {bound}"
    # Short vectors: sums may cancel, so measure against the inputs' magnitudes instead.
    limit = 2 * bound * float(scale.norm()) + 1e-6
    return None if err <= limit else f"L2 error {err:.3e} > {limit:.3e} (short vector)"


def _run_step(
    pycomm: ModuleType,
    rank: int,
    world: int,
    seed: int,
    index: int,
    step: dict[str, Any],
    groups: dict[str, Any],
) -> str | None:
    """Runs one planned collective and checks it; returns why it is wrong, or None."""
    kind = step["kind"]
    group = groups[step["group"]]
    n = step["n"]
    if kind in ("all_reduce", "all_reduce_compressed"):
        inputs = _inputs(seed, index, step, world, lambda r: (n,))
        t = inputs[rank].clone()
        pycomm.set_algorithm(step["algorithm"], group=group)
        if kind == "all_reduce":
            dist.all_reduce(t, op=reduce_op(step["op"]), group=group)
            return check_reduced(t, inputs, step["op"])
        pycomm.all_reduce(t, op=reduce_op(step["op"]), compression=step["codec"], group=group)
        return _check_compressed(t, inputs, step["op"], step["codec"])
    if kind == "broadcast":
        root = step["root"]
        own = input_for(seed * 1_000_003 + index, rank, (n,), step["dtype"], None)
        expected = input_for(seed * 1_000_003 + index, root, (n,), step["dtype"], None)
        dist.broadcast(own, src=root, group=group)
        return check_equal(own, expected)
    if kind == "reduce":
        root = step["root"]
        inputs = _inputs(seed, index, step, world, lambda r: (n,))
        t = inputs[rank].clone()
        dist.reduce(t, dst=root, op=reduce_op(step["op"]), group=group)
        return check_reduced(t, inputs, step["op"]) if rank == root else None
    if kind == "all_gather_into_tensor":
        inputs = _inputs(seed, index, step, world, lambda r: (n,))
        out = torch.empty(world * n, dtype=step["dtype"])
        dist.all_gather_into_tensor(out, inputs[rank], group=group)
        return check_equal(out, torch.cat(inputs))
    if kind == "reduce_scatter_tensor":
        inputs = _inputs(seed, index, step, world, lambda r: (world * n,))
        out = torch.empty(n, dtype=step["dtype"])
        dist.reduce_scatter_tensor(out, inputs[rank].clone(), op=reduce_op(step["op"]), group=group)
        mine = [x[rank * n : (rank + 1) * n] for x in inputs]
        return check_reduced(out, mine, step["op"])
    if kind == "all_to_all_single":
        splits = step.get("splits") or [[n] * world for _ in range(world)]
        inputs = _inputs(seed, index, step, world, lambda r: (sum(splits[r]),))
        received = [splits[j][rank] for j in range(world)]
        out = torch.empty(sum(received), dtype=step["dtype"])
        dist.all_to_all_single(
            out,
            inputs[rank],
            output_split_sizes=received if "splits" in step else None,
            input_split_sizes=splits[rank] if "splits" in step else None,
            group=group,
        )
        pieces = []
        for j in range(world):
            offset = sum(splits[j][:rank])
            pieces.append(inputs[j][offset : offset + splits[j][rank]])
        return check_equal(out, torch.cat(pieces))
    raise AssertionError(kind)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _trimmed_rss_bytes() -> int:
    """RSS after glibc returned its free pages to the kernel (malloc_trim): live memory, without
    what the allocator keeps cached in its per-thread arenas after random-size allocations."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    return _rss_bytes()


def _fd_table() -> dict[str, str]:
    table = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            table[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed since listdir
            pass
    return table


def _open_fds() -> tuple[int, dict[str, str]]:
    """Open fds, ignoring ones that exist only for an instant (torch and the runtime open and close
    short-lived fds from their own threads): the least of a few reads 5 ms apart, and that read's
    fd -> target table (so that a failure says what the extra fd is). A leaked fd stays open, so it
    is in every read."""
    reads = []
    for _ in range(3):
        reads.append(_fd_table())
        time.sleep(0.005)
    least = min(reads, key=len)
    return len(least), least


def _soak_worker(rank: int, world: int, n_ops: int, seed: int) -> dict[str, Any]:
    import pycomm

    warnings.filterwarnings("ignore", category=FutureWarning)  # *_tensor renamed in torch 2.13
    torch.manual_seed(seed)
    groups = {
        "auto": None,  # the default group: shared memory here (every rank on this host)
        "tcp": dist.new_group(backend="pycomm", pg_options=pycomm.Options(transport="tcp")),
    }
    wrong: list[str] = []
    n_wrong = 0
    issued: Counter[tuple[str, str]] = Counter()  # (group, stats key) -> calls

    def run(index: int, step: dict[str, Any]) -> None:
        nonlocal n_wrong
        try:
            why = _run_step(pycomm, rank, world, seed, index, step, groups)
        except Exception as exc:
            raise RuntimeError(f"rank {rank} step {index} ({_describe(step)}): {exc}") from exc
        key = f"allreduce/{step['codec']}" if "codec" in step else STATS_KEY[step["kind"]]
        issued[(step["group"], key)] += 1
        if why is not None:
            n_wrong += 1
            if len(wrong) < MAX_REPORTED_WRONG:
                wrong.append(f"rank {rank} step {index} ({_describe(step)}): {why}")
                sys.stderr.write(f"[soak] WRONG {wrong[-1]}\n")

    for i, step in enumerate(_warmup_steps(world)):
        run(-1 - i, step)
    dist.barrier()

    rng = random.Random(seed)
    samples: list[tuple[int, int, int, int]] = []  # (step, trimmed rss, fds, raw rss)
    fd_tables: dict[int, dict[str, str]] = {}  # step -> fd table, for the first and any that differ
    kinds: Counter[str] = Counter()
    start = time.monotonic()
    for index in range(n_ops):
        if index % SAMPLE_EVERY == 0:
            raw = _rss_bytes()
            fds, table = _open_fds()
            if not fd_tables or fds != samples[0][2]:
                fd_tables[index] = table
            samples.append((index, _trimmed_rss_bytes(), fds, raw))
        step = plan_step(rng, world)
        kinds[step["kind"]] += 1
        run(index, step)
    elapsed = time.monotonic() - start
    raw = _rss_bytes()
    fds, table = _open_fds()
    if fds != samples[0][2]:
        fd_tables[n_ops] = table
    samples.append((n_ops, _trimmed_rss_bytes(), fds, raw))

    stats_mismatch = []
    for name, group in groups.items():
        stats = pycomm.stats(group=group)
        for (g, key), calls in issued.items():
            if g != name:
                continue
            got = int(stats.get(key, {}).get("calls", 0))
            if got != calls:
                stats_mismatch.append(f"group {name}: stats[{key!r}].calls = {got}, issued {calls}")
    dist.destroy_process_group(groups["tcp"])
    return {
        "n_wrong": n_wrong,
        "wrong": wrong,
        "samples": samples,
        "fd_tables": fd_tables,
        "elapsed": elapsed,
        "kinds": dict(kinds),
        "stats_mismatch": stats_mismatch,
    }


def test_soak_random_collectives(pycomm: ModuleType) -> None:
    n_ops = int(os.environ.get("PYCOMM_SOAK_OPS", str(DEFAULT_OPS)))
    results = run_ranks(
        _soak_worker,
        WORLD,
        backend="pycomm",
        timeout_s=180 + n_ops * 0.12,
        pg_timeout_s=120,
        args=(n_ops, SEED),
    )
    problems = []
    for rank, res in enumerate(results):
        problems += res["wrong"]
        if res["n_wrong"] > len(res["wrong"]):
            problems.append(f"rank {rank}: ... {res['n_wrong']} wrong results in all")
        problems += [f"rank {rank}: {m}" for m in res["stats_mismatch"]]
        samples = res["samples"]
        base_rss, base_fds = samples[0][1], samples[0][2]
        peak_step, peak_rss = max(((s[0], s[1]) for s in samples), key=lambda s: s[1])
        if peak_rss > base_rss * (1 + RSS_GROWTH_LIMIT):
            problems.append(
                f"rank {rank}: RSS grew from {base_rss / 2**20:.1f} MiB to {peak_rss / 2**20:.1f} MiB "
                f"(step {peak_step}), more than {RSS_GROWTH_LIMIT:.0%}"
            )
        fds = sorted({s[2] for s in samples})
        if fds != [base_fds]:
            tables = res["fd_tables"]
            first = tables[samples[0][0]]
            changes = {
                step: {fd: table.get(fd, first.get(fd)) for fd in set(table) ^ set(first)}
                for step, table in tables.items()
                if step != samples[0][0]
            }
            problems.append(
                f"rank {rank}: open fds changed after warm-up: {[(s[0], s[2]) for s in samples]}; "
                f"fds added or gone by step: {changes}"
            )
    r0 = results[0]
    rss = [s[1] / 2**20 for s in r0["samples"]]
    raw = [s[3] / 2**20 for s in r0["samples"]]
    print(
        f"\n[soak] {n_ops} random collectives at world {WORLD} (seed {SEED}) in "
        f"{max(r['elapsed'] for r in results):.1f}s; wrong: {sum(r['n_wrong'] for r in results)}; "
        f"kinds {r0['kinds']}; rank 0 RSS after malloc_trim {rss[0]:.1f} -> max {max(rss):.1f} -> "
        f"end {rss[-1]:.1f} MiB (raw {raw[0]:.1f} -> max {max(raw):.1f} -> end {raw[-1]:.1f}); "
        f"fds {sorted({s[2] for s in r0['samples']})}"
    )
    every = max(1, len(r0["samples"]) // 10)
    print(
        "[soak] rank 0 RSS (MiB) by step: "
        + ", ".join(
            f"{s[0]}: {s[1] / 2**20:.1f} (raw {s[3] / 2**20:.1f})"
            for s in r0["samples"][::every] + r0["samples"][-1:]
        )
    )
    assert not problems, "\n".join(problems[:60])
