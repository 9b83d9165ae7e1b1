"""The launcher itself must report failures and hangs, or every other test could pass vacuously.

Uses gloo only: this checks tests/mp.py, not a backend.
"""

from __future__ import annotations

import os
import time

import pytest
import torch.distributed as dist
from mp import RanksFailed, run_ranks


def _ok_worker(rank: int, world: int, token: str) -> tuple[int, int, str, str | None]:
    return rank, world, token, os.environ.get("OMP_NUM_THREADS")


def _raising_worker(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("boom from rank one")
    dist.barrier()  # stuck until the launcher kills it


def _hanging_worker(rank: int, world: int) -> int:
    if rank == 1:
        time.sleep(3600)
    return os.getpid()


def test_results_in_rank_order() -> None:
    results = run_ranks(_ok_worker, 3, backend="gloo", args=("tok",), init="tcp")
    assert results == [(r, 3, "tok", "1") for r in range(3)]


def test_exception_is_reraised_with_traceback() -> None:
    start = time.monotonic()
    with pytest.raises(RanksFailed) as info:
        run_ranks(_raising_worker, 2, backend="gloo", timeout_s=60)
    message = str(info.value)
    assert "rank 1 raised" in message and "boom from rank one" in message
    assert "_raising_worker" in message  # the child's traceback text
    assert time.monotonic() - start < 40, (
        "a failed rank must not make the launcher wait for the full timeout"
    )


def test_hang_is_killed_and_named() -> None:
    start = time.monotonic()
    with pytest.raises(RanksFailed) as info:
        run_ranks(_hanging_worker, 2, backend="gloo", timeout_s=8)
    assert "ranks [1] hung" in str(info.value)
    assert time.monotonic() - start < 30
