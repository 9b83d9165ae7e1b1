"""Ranks that disagree about the collective (kind, size, dtype, reduce op, compression, root): an
error on every rank within seconds, naming the ops, then a working group.

Measured figures are printed with the ``[reliability]`` prefix (run with ``-s``); see
docs/RELIABILITY.md. Ranks run under cluster.Cluster, or mp.run_ranks where only their results matter.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from cluster import TRANSPORTS, error_info, report
from mp import run_ranks
from support import store_barrier as _store_barrier


# Ranks that disagree about the collective: an error on every rank, then a working group.

MISMATCH_PG_TIMEOUT_S = 6.0  # an error that only came from the timeout is distinguishable
MISMATCH_MAX_S = 3.0  # a detected mismatch takes milliseconds

# case -> op names the message must mention. MISMATCH_CASES: ranks that disagree on the kind,
# size, dtype, reduce op or compression. SENDER_ONLY_MISMATCH_CASES: some rank only sends (a
# broadcast root, a reduce leaf), so only the receivers can see the disagreement and must tell
# the senders.
MISMATCH_CASES: dict[str, tuple[str, ...]] = {
    "kind_allreduce_vs_broadcast": ("allreduce", "broadcast"),
    "kind_allreduce_vs_allgather": ("allreduce", "allgather"),
    "size": ("allreduce",),
    "dtype_same_width": ("allreduce",),  # float32 vs int32: same byte count
    "dtype_other_width": ("allreduce",),
    "reduce_op": ("allreduce",),
    "compression_fp16_vs_bf16": ("allreduce",),
    "compression_none_vs_fp8": ("allreduce",),
}
SENDER_ONLY_MISMATCH_CASES: dict[str, tuple[str, ...]] = {
    "broadcast_root": ("broadcast",),  # group of 2, roots swapped: both ranks only send
    "reduce_root": ("reduce",),  # group of 2, roots swapped: both ranks only receive
    "kind_allreduce_vs_reduce": ("allreduce", "reduce"),  # the reduce leaf only sends
}


def _mismatched_op(case: str, rank: int, world: int) -> None:
    import pycomm

    odd = rank == world - 1
    n = 1000
    if case == "kind_allreduce_vs_broadcast":
        t = torch.ones(n)
        dist.broadcast(t, src=0) if odd else dist.all_reduce(t)
    elif case == "kind_allreduce_vs_allgather":
        if odd:
            dist.all_gather_into_tensor(torch.empty(n * world), torch.ones(n))
        else:
            dist.all_reduce(torch.ones(n))
    elif case == "kind_allreduce_vs_reduce":
        dist.reduce(torch.ones(n), dst=0) if odd else dist.all_reduce(torch.ones(n))
    elif case == "size":
        dist.all_reduce(torch.ones(n + 1 if odd else n))
    elif case == "dtype_same_width":
        dist.all_reduce(torch.ones(n, dtype=torch.int32 if odd else torch.float32))
    elif case == "dtype_other_width":
        dist.all_reduce(torch.ones(n, dtype=torch.float64 if odd else torch.float32))
    elif case == "reduce_op":
        dist.all_reduce(torch.ones(n), op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)
    elif case == "compression_fp16_vs_bf16":
        pycomm.all_reduce(torch.ones(4096), compression="bf16" if odd else "fp16")
    elif case == "compression_none_vs_fp8":
        pycomm.all_reduce(torch.ones(4096), compression="fp8_e4m3" if odd else "none")
    elif case == "broadcast_root":
        dist.broadcast(torch.ones(n), src=1 if odd else 0)
    elif case == "reduce_root":
        dist.reduce(torch.ones(n), dst=1 if odd else 0)
    else:
        raise AssertionError(case)


def _mismatch_cases_worker(rank: int, world: int, cases: Sequence[str]) -> list[dict[str, Any]]:
    out = []
    inputs = [torch.arange(4099, dtype=torch.int64) * (r + 3) for r in range(world)]
    for case in cases:
        res: dict[str, Any] = {"case": case, "error": None}
        _store_barrier(f"{case}/before", world)
        start = time.monotonic()
        try:
            _mismatched_op(case, rank, world)
        except Exception as exc:  # noqa: BLE001
            res["error"] = error_info(exc)
        res["elapsed"] = time.monotonic() - start
        # Whatever happened, the ranks meet again before checking that the group still works.
        _store_barrier(f"{case}/after", world)
        t = inputs[rank].clone()
        try:
            dist.all_reduce(t)
            res["after"] = "ok" if torch.equal(t, sum(inputs)) else "wrong result"
        except Exception as exc:  # noqa: BLE001
            res["after"] = f"raised {type(exc).__name__}: {exc}"
        out.append(res)
    return out


def _check_mismatch_results(
    results: list[list[dict[str, Any]]], expected_ops: dict[str, tuple[str, ...]], world: int, transport: str
) -> None:
    odd = world - 1
    problems = []
    for rank, per_case in enumerate(results):
        for res in per_case:
            case, err = res["case"], res["error"]
            label = f"rank {rank} {case}"
            # A rank whose part of the op was complete before any peer could object (it only sent,
            # or got all it needed from ranks that agreed with it) hears of the mismatch from the
            # peer that saw it, raised by its next collective, which itself completes on every rank.
            late = err is None and "completed on this rank but failed on peer" in res["after"] and (
                "mismatched" in res["after"]
            )
            if late:
                report(f"mismatch {case} (world {world}, transport {transport}): rank {rank} told by its next op")
                continue
            if res["after"] != "ok":
                problems.append(f"{label}: the next all_reduce: {res['after']}")
            if err is None:
                problems.append(f"{label}: no error (returned after {res['elapsed']:.2f}s)")
                continue
            message = err["message"]
            if not err["runtime_error"]:
                problems.append(f"{label}: raised {err['type']}, not a RuntimeError")
            if res["elapsed"] > MISMATCH_MAX_S:
                problems.append(f"{label}: error after {res['elapsed']:.1f}s: {message!r}")
                continue
            if "mismatched" not in message:
                problems.append(f"{label}: message lacks 'mismatched': {message!r}")
                continue
            missing = [op for op in expected_ops[case] if op not in message]
            if missing:
                problems.append(f"{label}: message does not name {missing}: {message!r}")
            others = set(re.findall(r"\brank (\d+)\b", message)) - {str(odd)}
            if not re.search(rf"\brank {odd}\b", message) or not others:
                problems.append(f"{label}: message does not name both sides: {message!r}")
    for res in results[0]:
        err = res["error"]
        report(
            f"mismatch {res['case']} (world {world}, transport {transport}): rank 0 "
            + (f"raised in {res['elapsed'] * 1000:.1f} ms: {err['message'][:150]!r}" if err else "no error")
        )
    assert not problems, f"world {world}, transport {transport}:\n" + "\n".join(problems)


def _run_mismatch_cases(cases: dict[str, tuple[str, ...]], world: int, transport: str) -> None:
    results = run_ranks(
        _mismatch_cases_worker,
        world,
        backend="pycomm",
        timeout_s=60 + len(cases) * (2 * MISMATCH_PG_TIMEOUT_S + 5),
        pg_timeout_s=MISMATCH_PG_TIMEOUT_S,
        args=(list(cases),),
        env={"PYCOMM_TRANSPORT": transport},
    )
    _check_mismatch_results(results, cases, world, transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world", [2, 3])
def test_mismatches_raise_on_every_rank_and_group_recovers(
    pycomm: ModuleType, world: int, transport: str
) -> None:
    _run_mismatch_cases(MISMATCH_CASES, world, transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world", [2, 3])
def test_mismatches_seen_only_by_receivers_raise_on_every_rank(
    pycomm: ModuleType, world: int, transport: str
) -> None:
    """The root is in every frame header, so a disagreement about it must fail like the others,
    on the ranks that only send too."""
    _run_mismatch_cases(SENDER_ONLY_MISMATCH_CASES, world, transport)
