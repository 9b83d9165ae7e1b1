"""monitored_barrier on pycomm groups (ProcessGroup.monitored_barrier, through
pycomm.monitored_barrier since torch's dist.monitored_barrier accepts gloo groups only): at world 3
with every rank present it passes; with rank 2 absent rank 0 raises naming rank 2 within the timeout
and rank 1 raises too instead of hanging; wait_all_ranks=True names every absent rank; the group
keeps working after each failure."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from support import Failures, assert_no_failures

TIMEOUT_S = 90
SHORT = timedelta(milliseconds=1500)


def _raises(f: Failures, label: str, call: object, must_say: list[str]) -> None:
    start = time.monotonic()
    try:
        call()  # type: ignore[operator]
    except RuntimeError as e:
        took = time.monotonic() - start
        for words in must_say:
            f.check(f"{label}: names {words!r}", None if words in str(e) else f"error: {e}")
        f.check(f"{label}: within the timeout", None if took < 10 * SHORT.total_seconds() else f"took {took:.1f} s")
        return
    f.add(label, "did not raise")


def _group_works(f: Failures, label: str, world: int) -> None:
    t = torch.ones(3)
    dist.all_reduce(t)
    f.check(f"{label}: all_reduce afterwards", None if torch.equal(t, torch.full((3,), float(world))) else f"{t}")


def monitored_worker(rank: int, world: int) -> tuple[list[str], int]:
    import pycomm

    f = Failures(rank)
    with f.guard("all present"):
        pycomm.monitored_barrier(timeout=timedelta(seconds=30))
        pycomm.monitored_barrier()  # the group's timeout
    _group_works(f, "all present", world)
    # Rank 2 does not enter.
    if rank == 0:
        _raises(f, "rank 2 absent, rank 0", lambda: pycomm.monitored_barrier(timeout=SHORT), ["Rank 2", "1500 ms"])
    elif rank == 1:
        _raises(f, "rank 2 absent, rank 1", lambda: pycomm.monitored_barrier(timeout=SHORT), ["rank 0"])
    _group_works(f, "after rank 2 was absent", world)
    # Ranks 1 and 2 do not enter: wait_all_ranks names both.
    if rank == 0:
        _raises(
            f, "wait_all_ranks", lambda: pycomm.monitored_barrier(timeout=SHORT, wait_all_ranks=True), ["Ranks 1, 2"]
        )
    _group_works(f, "after wait_all_ranks", world)
    # No monitored barrier after these: like gloo's, each call has tags of its own, and the ranks
    # that skipped a call are one behind (test_a_late_arrival_... shows why the tags must differ).
    return f.result()


def test_monitored_barrier_names_the_absent_ranks() -> None:
    assert_no_failures(run_ranks(monitored_worker, 3, backend="pycomm", timeout_s=TIMEOUT_S, pg_timeout_s=30))


def single_worker(rank: int, world: int) -> tuple[list[str], int]:
    import pycomm

    f = Failures(rank)
    with f.guard("world 1"):
        pycomm.monitored_barrier(timeout=SHORT)
        f.check("world 1", None)
    with f.guard("a gloo group is refused"):
        gloo = dist.new_group(backend="gloo")
        with pytest.raises(TypeError, match="pycomm backend"):
            pycomm.monitored_barrier(gloo)
        f.check("a gloo group is refused", None)
    return f.result()


def test_monitored_barrier_world_one_and_other_backends() -> None:
    assert_no_failures(run_ranks(single_worker, 1, backend="pycomm", timeout_s=TIMEOUT_S))


def stale_worker(rank: int, world: int) -> tuple[list[str], int]:
    """A rank that arrives after rank 0 gave up must not satisfy rank 0's next barrier."""
    import pycomm

    f = Failures(rank)
    if rank == 1:
        time.sleep(2.5)  # rank 0's first barrier (1.5 s) is over
    try:
        pycomm.monitored_barrier(timeout=SHORT)
    except RuntimeError:
        pass
    if rank == 1:
        time.sleep(2.0)  # late for the second one too, but within its 20 s
    start = time.monotonic()
    try:
        pycomm.monitored_barrier(timeout=timedelta(seconds=20))
        f.check("second barrier", None)
    except RuntimeError as e:
        f.add("second barrier", f"raised {e}")
    took = time.monotonic() - start
    if rank == 0:
        f.check("the second barrier waited for rank 1", None if took > 1.0 else f"returned after {took:.2f} s")
    return f.result()


def test_a_late_arrival_does_not_pass_the_next_barrier() -> None:
    assert_no_failures(run_ranks(stale_worker, 2, backend="pycomm", timeout_s=TIMEOUT_S, pg_timeout_s=30))


def exited_worker(rank: int, world: int) -> tuple[list[str], int]:
    """Rank 1 aborts its group (its connections close) before the barrier: rank 0 names it, with
    the connection's error, instead of passing the transport's error on unnamed."""
    import pycomm

    f = Failures(rank)
    dist.barrier()
    if rank == 1:
        dist.group.WORLD._get_backend(torch.device("cpu")).abort()
        f.check("rank 1 aborted", None)
        return f.result()
    if rank == 2:
        time.sleep(1.0)
    if rank == 0:
        _raises(f, "rank 1 exited", lambda: pycomm.monitored_barrier(timeout=timedelta(seconds=5)), ["Rank 1"])
    else:
        try:
            pycomm.monitored_barrier(timeout=timedelta(seconds=5))
        except RuntimeError:
            pass
        f.check("rank 2 returned", None)
    return f.result()


def test_a_rank_whose_connections_closed_is_named() -> None:
    assert_no_failures(run_ranks(exited_worker, 3, backend="pycomm", timeout_s=TIMEOUT_S, pg_timeout_s=30, destroy=False))
