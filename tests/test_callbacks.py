"""Future callbacks that issue collectives and wait for them, as DDP's PowerSGD hook does.

A callback runs on the thread that completes the op. In pycomm that is the thread that runs the
group's ops in issue order, so an op issued from a callback must run there and then, not queue
behind the op whose completion is running the callback. Results are integers: checked exactly
against values computed here.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch
from mp import run_ranks

TIMEOUT_S = 120
PG_TIMEOUT_S = 30  # a deadlock fails as a timeout well inside TIMEOUT_S
N = 1021  # prime: not divisible by the world size


def _all_reduce_now(value: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    t = value.clone()
    return dist.all_reduce(t, async_op=True).get_future().wait()[0]


def _callbacks_worker(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    base = torch.arange(N, dtype=torch.int64) * (rank + 1)
    a = base.clone()
    fut_a = dist.all_reduce(a, async_op=True).get_future()

    # Two chained callbacks, each issuing a collective and waiting for it inside the callback.
    def double_and_sum(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        return _all_reduce_now(f.value()[0] * 2)

    def broadcast_from_last(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        t = f.value() + rank  # differs per rank until the broadcast
        dist.broadcast(t, src=world - 1, async_op=True).get_future().wait()
        return t

    chained = fut_a.then(double_and_sum).then(broadcast_from_last)

    # Issued after the callbacks were attached (as DDP hooks attach them: right after the op), so
    # on every rank it runs after the ops they issue.
    b = torch.full((N,), rank + 7, dtype=torch.int64)
    work_b = dist.all_reduce(b, async_op=True)

    # A callback whose op has its own callback that issues a third op (nesting two deep).
    c = torch.full((3,), rank, dtype=torch.int64)

    def nested(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        inner = f.value()[0].clone()
        inner_fut = dist.all_reduce(inner, async_op=True).get_future()
        return inner_fut.then(lambda g: _all_reduce_now(g.value()[0] + 1)).wait()

    nested_fut = dist.all_reduce(c, async_op=True).get_future().then(nested)

    # A callback attached after its op completed runs on this thread, at once.
    d = torch.ones(5, dtype=torch.int64)
    work_d = dist.all_reduce(d, async_op=True)
    work_d.wait()
    late = work_d.get_future().then(lambda f: _all_reduce_now(f.value()[0])).wait()

    chained_value = chained.wait()
    work_b.wait()
    return {"a": a, "chained": chained_value, "b": b, "nested": nested_fut.wait(), "late": late}


def _expected(world: int) -> dict[str, torch.Tensor]:
    idx = torch.arange(N, dtype=torch.int64)
    a = idx * sum(r + 1 for r in range(world))
    chained = world * (2 * a) + (world - 1)
    b = torch.full((N,), sum(r + 7 for r in range(world)), dtype=torch.int64)
    c = torch.full((3,), sum(range(world)), dtype=torch.int64)
    nested = world * (world * c + 1)
    late = torch.full((5,), world * world, dtype=torch.int64)
    return {"a": a, "chained": chained, "b": b, "nested": nested, "late": late}


def _check(results: list[dict[str, Any]], world: int) -> None:
    expected = _expected(world)
    for rank, got in enumerate(results):
        for key, want in expected.items():
            assert torch.equal(got[key], want), (
                f"rank {rank}: {key} = {got[key][:8].tolist()}..., expected {want[:8].tolist()}..."
            )


# pycomm only. gloo numbers an op when it is issued and runs ops on two threads, so in gloo this
# program's ops can get different numbers on different ranks: a callback attached before its op
# completes issues its op later (on a worker thread) than one attached after. gloo hangs on it at
# world 3 (observed with torch 2.13). pycomm runs ops, and the callbacks that complete them, in
# one order on one thread, so every rank runs a callback's op at the same point.
@pytest.mark.parametrize(
    ("world", "transport"), [(1, None), (3, None), (4, None), (3, "tcp")]
)
def test_callbacks_issue_collectives(
    pycomm: ModuleType, world: int, transport: str | None
) -> None:
    options = pycomm.Options(transport=transport, algorithm="rhd") if transport else None
    results = run_ranks(
        _callbacks_worker,
        world,
        backend="pycomm",
        timeout_s=TIMEOUT_S,
        pg_timeout_s=PG_TIMEOUT_S,
        pg_options=options,
    )
    _check(results, world)


def _value_after_wait_worker(rank: int, world: int) -> int:
    import torch.distributed as dist

    wrong = 0
    for i in range(2000):
        t = torch.full((7,), i + rank, dtype=torch.int64)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        # wait() returned, so the future must hold the value already (no wait on it here).
        value = work.get_future().value()[0]
        if int(value[0]) != world * i + sum(range(world)):
            wrong += 1
    return wrong


def _run_on_two_ranks(worker: Callable[[int, int], Any]) -> list[Any]:
    return run_ranks(worker, 2, backend="pycomm", timeout_s=TIMEOUT_S, pg_timeout_s=PG_TIMEOUT_S)


def test_future_value_right_after_wait(pycomm: ModuleType) -> None:
    results = _run_on_two_ranks(_value_after_wait_worker)
    assert results == [0, 0], f"wrong values per rank: {results}"


def _autograd_in_callback_worker(rank: int, world: int) -> list[bool]:
    import torch.distributed as dist

    big = torch.ones(4 << 20)
    dist.all_reduce(big, async_op=True)  # keeps the worker busy, so the callback below runs there
    x = torch.ones(3, requires_grad=True)
    fut = dist.all_reduce(torch.ones(3), async_op=True).get_future()
    seen = fut.then(lambda f: [torch.is_grad_enabled(), (x * 2).requires_grad]).wait()
    return list(seen)


def test_callbacks_run_with_autograd(pycomm: ModuleType) -> None:
    # The op's own writes bypass autograd; the user's callbacks must not.
    results = _run_on_two_ranks(_autograd_in_callback_worker)
    assert results == [[True, True], [True, True]], results


def _future_after_failure_worker(rank: int, world: int) -> list[str]:
    import torch.distributed as dist

    # Rank 1 disagrees on the count: the op fails on both ranks. The future, first asked for after
    # the failure, carries it; one asked for before it does too.
    store = dist.distributed_c10d._get_default_store()
    outcomes = []
    for ask_first in (False, True):
        if ask_first and rank == 1:
            store.wait(["asked"])  # rank 0 holds its future before the op can fail
        work = dist.all_reduce(torch.ones(10 + rank), async_op=True)
        early = work.get_future() if ask_first else None
        if ask_first and rank == 0:
            store.set("asked", "1")
        try:
            work.wait()
            outcomes.append("wait: no error")
        except RuntimeError:
            pass
        for fut in (early, work.get_future()):
            if fut is None:
                continue
            try:
                fut.wait()
                outcomes.append(f"ask_first={ask_first}: future without error")
            except RuntimeError as e:
                if "mismatched" not in str(e):
                    outcomes.append(f"ask_first={ask_first}: future with another error: {e}")
    return outcomes


def test_future_of_a_failed_op_carries_its_error(pycomm: ModuleType) -> None:
    results = _run_on_two_ranks(_future_after_failure_worker)
    assert results == [[], []], results
