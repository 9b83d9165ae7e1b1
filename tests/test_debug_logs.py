"""Observability: PYCOMM_DEBUG=INFO logs one line per op, TRACE logs the frames, and
TORCH_DISTRIBUTED_DEBUG=DETAIL works with the pycomm backend.

Measured figures are printed with the ``[reliability]`` prefix (run with ``-s``); see
docs/RELIABILITY.md. Ranks run under cluster.Cluster, or mp.run_ranks where only their results matter.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from cluster import EXIT_MAX_S, TRANSPORTS, Cluster, Control, report


# Observability: PYCOMM_DEBUG=INFO / TRACE lines, and TORCH_DISTRIBUTED_DEBUG=DETAIL.

_INFO_OP_LINE = re.compile(
    r"^\[pycomm INFO\]\[rank (?P<rank>\d+)/(?P<size>\d+) group (?P<group>[^\]]+)\]\s+"
    r"seq=(?P<seq>\d+) (?P<op>[a-z_]+) (?P<bytes>\d+) B (?P<algorithm>[\w-]+) (?P<transport>\w+) "
    r"sent (?P<sent>\d+) B (?P<us>\d+) us$"
)


def _logged_ops_worker(rank: int, world: int, ctl: Control) -> list[tuple[str, int]]:
    """Runs a known list of collectives; returns (op name as pycomm logs it, payload bytes)."""
    import pycomm

    ops: list[tuple[str, int]] = []
    for algorithm in ("ring", "tree", "rhd"):
        pycomm.set_algorithm(algorithm)
        t = torch.ones(1024)
        dist.all_reduce(t)
        assert t[0].item() == world
        ops.append(("allreduce", 4096))
    t = torch.arange(512, dtype=torch.float64)
    dist.broadcast(t, src=0)
    ops.append(("broadcast", 4096))
    out = torch.empty(world * 256, dtype=torch.int32)
    dist.all_gather_into_tensor(out, torch.full((256,), rank, dtype=torch.int32))
    ops.append(("allgather", 1024))
    dist.barrier()
    ops.append(("barrier", 0))
    return ops


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_debug_info_logs_one_line_per_op(pycomm: ModuleType, transport: str) -> None:
    world = 2
    env = {"PYCOMM_DEBUG": "INFO", "PYCOMM_TRANSPORT": transport}
    with Cluster(_logged_ops_worker, world, env=env, hang_timeout_s=90) as c:
        expected = [c.result(rank, timeout=60) for rank in range(world)]
        for rank in range(world):
            c.wait_exit(rank, timeout=EXIT_MAX_S)
        logs = [c.stderr(rank) for rank in range(world)]

    problems = []
    for rank in range(world):
        # Ops run while the group is set up (e.g. the barrier of the shared-memory setup) come
        # before the "connected" line; the user's ops are the ones after it.
        log = logs[rank]
        connected = log.find("] connected over ")
        if connected < 0:
            problems.append(f"rank {rank}: no 'connected over' INFO line\n{log[-2000:]}")
            continue
        lines = [m for m in map(_INFO_OP_LINE.match, log[connected:].splitlines()) if m]
        ops = [(m["op"], int(m["bytes"])) for m in lines]
        if rank == 0:
            report(f"PYCOMM_DEBUG=INFO (transport {transport}), rank 0 op lines:\n  " +
                    "\n  ".join(m.group(0) for m in lines))
        if ops != expected[rank]:
            problems.append(
                f"rank {rank}: logged ops {ops}, expected {expected[rank]}\n{logs[rank][-3000:]}"
            )
            continue
        seqs = [int(m["seq"]) for m in lines]
        if seqs != sorted(seqs) or len(set(seqs)) != len(seqs):
            problems.append(f"rank {rank}: sequence numbers not increasing: {seqs}")
        for m in lines:
            if (int(m["rank"]), int(m["size"])) != (rank, world) or not m["group"].strip():
                problems.append(f"rank {rank}: bad rank/group field: {m.group(0)!r}")
            if m["transport"] not in ("tcp", "shm"):
                problems.append(f"rank {rank}: unknown transport in {m.group(0)!r}")
            if transport == "tcp" and m["transport"] != "tcp":
                problems.append(f"rank {rank}: transport tcp requested, line says {m.group(0)!r}")
        if transport == "tcp":
            algorithms = [m["algorithm"] for m in lines[:3]]
            if algorithms != ["ring", "tree", "rhd"]:
                problems.append(f"rank {rank}: set_algorithm not reflected: {algorithms}")
    assert not problems, "\n".join(problems)


def _one_allreduce_worker(rank: int, world: int, ctl: Control) -> float:
    t = torch.ones(1024)
    dist.all_reduce(t)
    return float(t[0])


def _one_allreduce_logs(world: int, env: dict[str, str]) -> list[str]:
    """Each rank's stderr after one all_reduce of ones, whose sums are checked."""
    with Cluster(_one_allreduce_worker, world, env=env, hang_timeout_s=90) as c:
        values = [c.result(rank, timeout=60) for rank in range(world)]
        for rank in range(world):
            c.wait_exit(rank, timeout=EXIT_MAX_S)
        logs = [c.stderr(rank) for rank in range(world)]
    assert values == [float(world)] * world
    return logs


def test_debug_trace_logs_frames(pycomm: ModuleType) -> None:
    world = 2
    logs = _one_allreduce_logs(world, {"PYCOMM_DEBUG": "TRACE", "PYCOMM_TRANSPORT": "tcp"})
    problems = []
    for rank, log in enumerate(logs):
        sends = [line for line in log.splitlines() if "send to peer" in line and "seq=" in line]
        recvs = [line for line in log.splitlines() if "recv from peer" in line and "seq=" in line]
        ops = [line for line in log.splitlines() if _INFO_OP_LINE.match(line)]
        if rank == 0:
            report(f"PYCOMM_DEBUG=TRACE rank 0: {len(sends)} send / {len(recvs)} recv frame lines, e.g. "
                    f"{(sends or ['-'])[0]!r} / {(recvs or ['-'])[0]!r}")
        if not sends or not recvs:
            problems.append(
                f"rank {rank}: {len(sends)} send and {len(recvs)} recv frame lines\n{log[-2000:]}"
            )
        if len(ops) != 1:
            problems.append(f"rank {rank}: {len(ops)} op lines under TRACE (expected the INFO line too)")
    assert not problems, "\n".join(problems)


def _detail_worker(rank: int, world: int, ctl: Control) -> dict[str, Any]:
    pg = dist.distributed_c10d._get_default_group()
    inputs = [torch.arange(10_000, dtype=torch.float64) * (r + 1) for r in range(world)]
    t = inputs[rank].clone()
    dist.all_reduce(t)
    ok = torch.equal(t, sum(inputs))
    dist.barrier()
    b = torch.full((100,), float(rank))
    dist.broadcast(b, src=world - 1)
    ok = ok and bool((b == world - 1).all())
    dist.barrier()
    return {"ok": ok, "pg": type(pg).__name__, "debug": str(dist.get_debug_level())}


def test_torch_distributed_debug_detail(pycomm: ModuleType) -> None:
    world = 2
    env = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    with Cluster(_detail_worker, world, env=env, hang_timeout_s=90) as c:
        results = [c.result(rank, timeout=60) for rank in range(world)]
        exits = [c.wait_exit(rank, timeout=EXIT_MAX_S)[0] for rank in range(world)]
    report(f"TORCH_DISTRIBUTED_DEBUG=DETAIL: {results}")
    assert all(r["ok"] for r in results), results
    assert all("DETAIL" in r["debug"] for r in results), results
    assert exits == [0] * world, exits


def test_startup_log_gives_the_chunk_in_use(pycomm: ModuleType) -> None:
    """A chunk_bytes (or cuda_chunk_bytes) past the core's 1 TiB limit is used as 1 TiB; the start-up
    line must say what is used, not echo the setting."""
    logs = _one_allreduce_logs(2, {"PYCOMM_DEBUG": "INFO", "PYCOMM_TRANSPORT": "tcp", "PYCOMM_CHUNK_BYTES": str(1 << 50),
                                   "PYCOMM_CUDA_CHUNK_BYTES": str(1 << 45)})
    for rank, log in enumerate(logs):
        line = next((l for l in log.splitlines() if "] connected over " in l), None)
        assert line is not None, f"rank {rank}: no 'connected over' line\n{log[-2000:]}"
        assert f", chunk {1 << 40} B, CUDA chunk {1 << 40} B" in line, f"rank {rank}: {line!r}"
