"""Hardening: bad arguments that must raise without touching memory, input errors the peers hear of
at once, timeouts that cannot overflow, waits that honour their own timeout, and teardown from
completion callbacks.

Each case here was a crash, a hang or a wrong error before its fix (docs/RELIABILITY.md has the
table). Cases that need the ranks to disagree line them up first through the rendezvous store, so
that the order of events is the one the case describes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from support import store_barrier as _store_barrier

# Errors must come from detection, not from the group timeout: the timeout is long enough that an
# error that only came from it is told apart, short enough that a failing run ends.
PG_TIMEOUT_S = 20.0
PROMPT_S = 5.0  # a detected error takes milliseconds; this allows for a loaded 2-core machine


def _outcome(op: Any) -> dict[str, Any]:
    start = time.monotonic()
    try:
        op()
    except Exception as exc:  # noqa: BLE001  (the parent checks type and message)
        return {"error": type(exc).__name__, "message": str(exc), "elapsed": time.monotonic() - start}
    return {"error": None, "message": "", "elapsed": time.monotonic() - start}


def _all_reduce_checked(rank: int, world: int, n: int = 1031) -> str:
    """An exact int64 all-reduce: 'ok', or what went wrong."""
    t = torch.arange(n, dtype=torch.int64) * (rank + 1)
    try:
        dist.all_reduce(t)
    except Exception as exc:  # noqa: BLE001
        return f"raised {type(exc).__name__}: {exc}"
    expected = torch.arange(n, dtype=torch.int64) * (world * (world + 1) // 2)
    return "ok" if torch.equal(t, expected) else "wrong result"


# ============================================================================================
# all_to_all_single split sizes: the sum of int64 splits must not wrap around.


def _overflowing_splits_worker(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    _store_barrier("splits", world)
    if rank == 0:
        t = torch.arange(4, dtype=torch.float32)
        splits = [2**63 - 1, 2**63 - 1, 6]  # "sums" to 4 in wrapped int64 arithmetic
        out["bad"] = _outcome(lambda: dist.all_to_all_single(torch.empty(4), t, splits, splits))
    else:
        out["bad"] = _outcome(lambda: dist.all_to_all_single(torch.empty(3), torch.arange(3, dtype=torch.float32)))
    out["after_bad"] = _all_reduce_checked(rank, world)
    # Without split sizes dim 0, not numel, must divide by the group size (gloo's rule).
    out["rows"] = _outcome(lambda: dist.all_to_all_single(torch.empty(4, 3), torch.zeros(4, 3)))
    out["after_rows"] = _all_reduce_checked(rank, world)
    return out


def _run_on_three_ranks(worker: Callable[[int, int], Any], options: Any) -> list[Any]:
    """The run both input-check cases make: 3 ranks, this file's group timeout, a 120 s hang limit."""
    return run_ranks(worker, 3, backend="pycomm", timeout_s=120, pg_timeout_s=PG_TIMEOUT_S, pg_options=options)


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_overflowing_split_sizes_raise_value_error_and_peers_hear_of_it(
    pycomm: ModuleType, transport: str
) -> None:
    results = _run_on_three_ranks(_overflowing_splits_worker, pycomm.Options(transport=transport))
    problems = []
    bad = results[0]["bad"]
    if bad["error"] != "ValueError" or "rank 0" not in bad["message"] or str(2**63 - 1) not in bad["message"]:
        problems.append(f"rank 0: expected a ValueError naming the rank and the splits, got {bad}")
    for rank in (1, 2):
        peer = results[rank]["bad"]
        if peer["error"] is None or peer["elapsed"] > PROMPT_S or "rank 0" not in peer["message"]:
            problems.append(f"rank {rank}: expected a prompt error naming rank 0, got {peer}")
    for rank, res in enumerate(results):
        rows = res["rows"]
        if rows["error"] != "ValueError" or "dim 0" not in rows["message"]:
            problems.append(f"rank {rank}: 4 rows over 3 ranks: expected a ValueError about dim 0, got {rows}")
        for key in ("after_bad", "after_rows"):
            if res[key] != "ok":
                problems.append(f"rank {rank}: the all_reduce after the bad call ({key}): {res[key]}")
    assert not problems, "\n".join(problems)


# ============================================================================================
# A check inside the core fails an op that its peers are running: they must hear of it at once,
# and the next op must pair with theirs (it used to take the peers' next failure for its own).


def _core_check_worker(rank: int, world: int) -> dict[str, Any]:
    _store_barrier("core-check", world)
    if rank == 0:
        # Sends itself 1 row but expects 2 from itself: only the core's all-to-all sees it.
        op = lambda: dist.all_to_all_single(  # noqa: E731
            torch.empty(3), torch.arange(3, dtype=torch.float32), [2, 1, 0], [1, 1, 1]
        )
    else:
        op = lambda: dist.all_to_all_single(torch.empty(3), torch.arange(3, dtype=torch.float32))  # noqa: E731
    return {"bad": _outcome(op), "after": _all_reduce_checked(rank, world)}


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_core_input_check_fails_the_op_on_every_rank(pycomm: ModuleType, transport: str) -> None:
    results = _run_on_three_ranks(_core_check_worker, pycomm.Options(transport=transport))
    problems = []
    for rank, res in enumerate(results):
        if res["bad"]["error"] is None or res["bad"]["elapsed"] > PROMPT_S or "itself" not in res["bad"]["message"]:
            problems.append(f"rank {rank}: expected a prompt error quoting rank 0's check, got {res['bad']}")
        if res["after"] != "ok":
            problems.append(f"rank {rank}: the next all_reduce: {res['after']}")
    assert not problems, "\n".join(problems)


# ============================================================================================
# Timeouts: a huge one must not overflow into "already expired"; a Work's wait(timeout) must
# honour that timeout, not the group's.


def _huge_timeout_worker(rank: int, world: int) -> dict[str, Any]:
    import pycomm

    group = dist.new_group(list(range(world)), timeout=timedelta.max)
    tcp = dist.new_group(list(range(world)), pg_options=pycomm.Options(transport="tcp", timeout=timedelta.max))
    out = {}
    for name, g in (("default", None), ("new_group", group), ("options", tcp)):
        t = torch.ones(5) * (rank + 1)
        out[name] = _outcome(lambda g=g, t=t: dist.all_reduce(t, group=g))
        out[name]["ok"] = bool(torch.equal(t, torch.full((5,), float(world * (world + 1) // 2))))
    return out


def test_huge_timeout_is_clamped(pycomm: ModuleType) -> None:
    results = run_ranks(
        _huge_timeout_worker,
        2,
        backend="pycomm",
        timeout_s=90,
        pg_timeout_s=None,
        pg_options=pycomm.Options(timeout=timedelta.max),
    )
    problems = [
        f"rank {rank} {name}: {res}"
        for rank, per in enumerate(results)
        for name, res in per.items()
        if res["error"] is not None or not res["ok"]
    ]
    assert not problems, "\n".join(problems)


def _p2p_wait_timeout_worker(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if rank == 0:
        work = dist.irecv(torch.empty(10), src=1)
        out["wait"] = _outcome(lambda: work.wait(timeout=timedelta(seconds=1)))
    _store_barrier("p2p-wait", world)  # rank 1 sends nothing before rank 0's wait is over
    out["after"] = _all_reduce_checked(rank, world)
    return out


def test_point_to_point_wait_honours_its_timeout(pycomm: ModuleType) -> None:
    results = run_ranks(_p2p_wait_timeout_worker, 2, backend="pycomm", timeout_s=90, pg_timeout_s=PG_TIMEOUT_S)
    wait = results[0]["wait"]
    assert wait["error"] is not None and 0.9 <= wait["elapsed"] < PROMPT_S, f"wait(timeout=1s) gave {wait}"
    assert "timed out" in wait["message"], wait
    assert [r["after"] for r in results] == ["ok", "ok"], results


BLOCK_PG_TIMEOUT_S = 3.0
BLOCK_LATE_SEND_S = 2.5  # the first receive of a block of two is matched this late


def _block_wait_timeout_worker(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {"first": _all_reduce_checked(rank, world)}
    buf = torch.zeros(4)
    if rank == 0:
        # A block of one receive that no send ever matches: its Work is the block's.
        for name, timeout in (("group", None), ("own", timedelta(seconds=1))):
            works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, 1)])
            args = {} if timeout is None else {"timeout": timeout}
            out[name] = _outcome(lambda works=works, args=args: [w.wait(**args) for w in works])
    # One deadline for the whole block: a receive matched late leaves the next one only the rest of
    # the group's timeout, not a timeout of its own.
    _store_barrier("block-late", world)
    if rank == 0:
        late, never = torch.zeros(4), torch.zeros(4)
        works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, late, 1), dist.P2POp(dist.irecv, never, 1, tag=1)])
        out["late"] = _outcome(lambda: [w.wait() for w in works])
        out["late_value"] = late.tolist()
    else:
        time.sleep(BLOCK_LATE_SEND_S)
        dist.send(torch.full((4,), 5.0), dst=0)
    # A block of two receives nobody sends to: the wait raises at the first one's timeout, and the
    # second is detached as well (a later send with its tag goes to the next receive, not to it).
    if rank == 0:
        first, second = torch.zeros(4), torch.zeros(4)
        works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, first, 1), dist.P2POp(dist.irecv, second, 1, tag=2)])
        out["both"] = _outcome(lambda: [w.wait(timeout=timedelta(seconds=1)) for w in works])
    _store_barrier("block-wait", world)  # rank 1 sends nothing more before rank 0's waits are over
    if rank == 1:
        dist.send(torch.full((4,), 9.0), dst=0, tag=2)
    else:
        fresh_tagged = torch.zeros(4)
        dist.recv(fresh_tagged, src=1, tag=2)
        out["fresh_tagged"] = fresh_tagged.tolist()
        out["second_buffer"] = second.tolist()
    # The receives that timed out are gone: this send reaches the receive posted after them.
    if rank == 1:
        dist.send(torch.full((4,), 7.0), dst=0)
    else:
        fresh = torch.zeros(4)
        dist.recv(fresh, src=1)
        out["fresh"] = fresh.tolist()
        out["timed_out_buffer"] = buf.tolist()
    out["after"] = _all_reduce_checked(rank, world)
    return out


def test_block_of_receives_waits_by_the_timeout(pycomm: ModuleType) -> None:
    """batch_isend_irecv returns the block's Work: its wait() ends by the group's timeout (or its
    own), detaching the block's receives, as a lone irecv's wait does."""
    results = run_ranks(
        _block_wait_timeout_worker, 2, backend="pycomm", timeout_s=60, pg_timeout_s=BLOCK_PG_TIMEOUT_S
    )
    group, own = results[0]["group"], results[0]["own"]
    assert group["error"] is not None and "timed out" in group["message"], group
    assert 0.9 * BLOCK_PG_TIMEOUT_S <= group["elapsed"] < BLOCK_PG_TIMEOUT_S + PROMPT_S, group
    assert own["error"] is not None and "timed out" in own["message"] and 0.9 <= own["elapsed"] < PROMPT_S, own
    late = results[0]["late"]
    assert late["error"] is not None and "timed out" in late["message"], late
    assert late["elapsed"] < BLOCK_PG_TIMEOUT_S * 1.5, f"a block's receives waited a timeout each: {late}"
    assert results[0]["late_value"] == [5.0] * 4, results[0]
    both = results[0]["both"]
    assert both["error"] is not None and "timed out" in both["message"] and both["elapsed"] < PROMPT_S, both
    assert results[0]["fresh_tagged"] == [9.0] * 4, results[0]
    assert results[0]["second_buffer"] == [0.0] * 4, f"a receive of the block was left posted: {results[0]}"
    assert results[0]["fresh"] == [7.0] * 4, results[0]
    assert results[0]["timed_out_buffer"] == [0.0] * 4, results[0]
    assert [r["first"] for r in results] == ["ok", "ok"] and [r["after"] for r in results] == ["ok", "ok"], results


# ============================================================================================
# Teardown from a completion callback, from another thread, with ops queued: never a crash.


def _teardown_from_callback_worker(rank: int, world: int, how: str) -> dict[str, Any]:
    group = dist.distributed_c10d._get_default_group()
    backend = group._get_backend(torch.device("cpu"))
    actions = {
        "destroy": dist.destroy_process_group,
        "shutdown": backend.shutdown,
        "abort": backend.abort,
    }
    start = time.monotonic()
    t = torch.ones(1000)
    fut = dist.all_reduce(t, async_op=True).get_future()
    outcome = _outcome(lambda: fut.then(lambda f: actions[how]()).wait())
    outcome["total"] = time.monotonic() - start
    outcome["value"] = float(t[0])
    return outcome


@pytest.mark.parametrize("how", ["destroy", "shutdown", "abort"])
@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_teardown_from_a_completion_callback(pycomm: ModuleType, monkeypatch: pytest.MonkeyPatch, how: str, transport: str) -> None:
    monkeypatch.setenv("PYCOMM_TRANSPORT", transport)
    results = run_ranks(
        _teardown_from_callback_worker, 2, backend="pycomm", timeout_s=90, pg_timeout_s=PG_TIMEOUT_S,
        args=(how,), destroy=False,
    )
    for rank, res in enumerate(results):
        assert res["value"] == 2.0, f"rank {rank}: {res}"
        assert res["total"] < PROMPT_S, f"rank {rank}: teardown from a callback took {res['total']:.1f}s: {res}"
        if res["error"] is not None:
            # A clear refusal is allowed; a crash (the launcher reports it) or a hang is not.
            assert "callback" in res["message"], f"rank {rank}: {res}"


def _teardown_with_queued_ops_worker(rank: int, world: int, how: str) -> dict[str, Any]:
    group = dist.distributed_c10d._get_default_group()
    backend = group._get_backend(torch.device("cpu"))
    works = [dist.all_reduce(torch.ones(100_000), async_op=True) for _ in range(8)]
    start = time.monotonic()
    if how == "destroy":
        dist.destroy_process_group()
    elif how == "abort":
        backend.abort()
    else:
        backend.shutdown()
    outcomes = [_outcome(w.wait) for w in works]
    return {"elapsed": time.monotonic() - start, "errors": sum(o["error"] is not None for o in outcomes)}


@pytest.mark.parametrize("how", ["destroy", "shutdown", "abort"])
def test_teardown_with_ops_queued(pycomm: ModuleType, how: str) -> None:
    results = run_ranks(
        _teardown_with_queued_ops_worker, 2, backend="pycomm", timeout_s=90, pg_timeout_s=PG_TIMEOUT_S,
        args=(how,), destroy=False,
    )
    for rank, res in enumerate(results):
        assert res["elapsed"] < PG_TIMEOUT_S, f"rank {rank}: {res}"


# ============================================================================================
# A point-to-point completion callback that waits for another receive of the same group must not
# freeze the group's I/O (it used to run on the transport's event loop).


def _p2p_callback_waits_worker(rank: int, world: int) -> dict[str, Any]:
    if rank == 1:
        _store_barrier("posted", world)
        dist.send(torch.full((4,), 1.0), dst=0, tag=1)
        dist.send(torch.full((4,), 2.0), dst=0, tag=2)
        return {}
    second = torch.empty(4)
    seen: dict[str, Any] = {}

    def then(f: Any) -> None:
        start = time.monotonic()
        seen["second"] = _outcome(lambda: dist.recv(second, src=1, tag=2))
        seen["second"]["waited"] = time.monotonic() - start

    fut = dist.irecv(torch.empty(4), src=1, tag=1).get_future().then(then)
    _store_barrier("posted", world)
    fut.wait()
    seen["value"] = float(second[0])
    return seen


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_point_to_point_callback_may_wait_for_another_receive(pycomm: ModuleType, monkeypatch: pytest.MonkeyPatch, transport: str) -> None:
    monkeypatch.setenv("PYCOMM_TRANSPORT", transport)
    results = run_ranks(_p2p_callback_waits_worker, 2, backend="pycomm", timeout_s=90, pg_timeout_s=PG_TIMEOUT_S)
    seen = results[0]
    assert seen["second"]["error"] is None and seen["second"]["waited"] < PROMPT_S, seen
    assert seen["value"] == 2.0, seen


# ============================================================================================
# Unexpected data has a budget per peer: a member cannot make a rank hold unbounded memory.


def _unexpected_budget_worker(rank: int, world: int) -> dict[str, Any]:
    import pycomm

    group = dist.new_group(list(range(world)), pg_options=pycomm.Options(transport="tcp", unexpected_bytes=1 << 20))
    out: dict[str, Any] = {}
    if rank == 1:
        # Within the budget: sent ahead, received once posted.
        dist.send(torch.ones(1000), dst=0, group=group, tag=1)
        _store_barrier("budget-ahead", world)
        # Past it: 4 MiB nobody asked for.
        out["flood"] = _outcome(lambda: dist.send(torch.ones(1 << 20), dst=0, group=group, tag=99))
        _store_barrier("budget-flooded", world)
    else:
        _store_barrier("budget-ahead", world)
        t = torch.empty(1000)
        out["ahead"] = _outcome(lambda: dist.recv(t, src=1, group=group, tag=1))
        out["ahead"]["ok"] = bool(torch.equal(t, torch.ones(1000)))
        _store_barrier("budget-flooded", world)
        time.sleep(0.5)
        out["after"] = _outcome(lambda: dist.recv(torch.empty(1), src=1, group=group, tag=2))
    out["default_group"] = _all_reduce_checked(rank, world)
    return out


def test_unexpected_data_has_a_budget(pycomm: ModuleType) -> None:
    results = run_ranks(
        _unexpected_budget_worker, 2, backend="pycomm", timeout_s=90, pg_timeout_s=PG_TIMEOUT_S, destroy=False
    )
    rank0 = results[0]
    assert rank0["ahead"]["error"] is None and rank0["ahead"]["ok"], rank0
    after = rank0["after"]
    assert after["error"] is not None and after["elapsed"] < PROMPT_S, rank0
    assert "budget" in after["message"] and "peer 1" in after["message"], rank0
    assert [r["default_group"] for r in results] == ["ok", "ok"], results


def test_budget_and_timeout_options_are_validated(pycomm: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    assert pycomm.Options(unexpected_bytes=1 << 20).resolved().unexpected_bytes == 1 << 20
    assert pycomm.Options().resolved().unexpected_bytes == 4 << 30
    for bad in (0, 100, -1, "lots", 1 << 63):
        with pytest.raises(ValueError, match="unexpected_bytes"):
            pycomm.Options(unexpected_bytes=bad)
    monkeypatch.setenv("PYCOMM_UNEXPECTED_BYTES", "12x")
    with pytest.raises(ValueError, match="PYCOMM_"):
        pycomm.Options().resolved()
    for bad_timeout in (0, -5, timedelta(0), timedelta(seconds=-1)):
        with pytest.raises(ValueError, match="timeout must be positive"):
            pycomm.Options(timeout=bad_timeout)
    # What torch hands the creator for new_group(timeout=timedelta.max): wrapped into the past.
    assert pycomm.Options().timeout_ms(timedelta(days=-67519912)) == pycomm.options.MAX_TIMEOUT_MS
    assert pycomm.Options(timeout=timedelta.max).timeout_ms(timedelta(seconds=1)) == pycomm.options.MAX_TIMEOUT_MS
