"""The profiler sees pycomm as torch's own distributed suite checks gloo: under
`torch.autograd.profiler.profile(record_shapes=True)` each op records one async event
"pycomm:<op>" with count 1 and its input shapes, and `torch.profiler` traces and their
Chrome-trace export name the ops too. World 3; every c10d op pycomm implements."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from mp import run_ranks
from support import Failures, assert_no_failures

TIMEOUT_S = 90
SHAPE = [7, 3]


def _ops(rank: int, world: int) -> list[tuple[str, Callable[[], Any], list[list[int]]]]:
    """(event name, the call, the input shapes the event must record) for every op."""
    t = torch.ones(SHAPE)
    n, c = SHAPE
    whole = [world * n, c]
    root = rank == 0
    nxt, prv = (rank + 1) % world, (rank - 1) % world

    def send_recv() -> Any:
        if rank % 2 == 0:
            dist.send(t, nxt) if nxt != rank else None
            dist.recv(torch.empty(SHAPE), prv)
        else:
            dist.recv(torch.empty(SHAPE), prv)
            dist.send(t, nxt)

    return [
        ("all_reduce", lambda: dist.all_reduce(t), [SHAPE]),
        ("broadcast", lambda: dist.broadcast(t, 0), [SHAPE]),
        ("reduce", lambda: dist.reduce(t, 0), [SHAPE]),
        ("all_gather", lambda: dist.all_gather([torch.empty(SHAPE) for _ in range(world)], t), [SHAPE]),
        ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(torch.empty(whole), t), [SHAPE]),
        ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(torch.empty(SHAPE), torch.ones(whole)), [whole]),
        ("reduce_scatter", lambda: dist.reduce_scatter(torch.empty(SHAPE), [torch.ones(SHAPE)] * world), [SHAPE] * world),
        ("all_to_all_single", lambda: dist.all_to_all_single(torch.empty(whole), torch.ones(whole)), [whole]),
        ("all_to_all", lambda: dist.all_to_all([torch.empty(SHAPE) for _ in range(world)], [t] * world), [SHAPE] * world),
        ("gather", lambda: dist.gather(t, [torch.empty(SHAPE) for _ in range(world)] if root else None, 0), [SHAPE]),
        ("scatter", lambda: dist.scatter(torch.empty(SHAPE), [t] * world if root else None, 0),
         [SHAPE] * world if root else [SHAPE]),
        ("barrier", lambda: dist.barrier(), []),
        ("send", send_recv, [SHAPE]),
        ("recv", send_recv, [SHAPE]),
    ]


def autograd_profiler_worker(rank: int, world: int) -> tuple[list[str], int]:
    f = Failures(rank)
    for name, call, shapes in _ops(rank, world):
        with f.guard(name):
            with torch.autograd.profiler.profile(record_shapes=True) as prof:
                call()
            events = [e for e in prof.function_events if e.name == f"pycomm:{name}"]
            expected = 1
            f.check(f"{name}: events", None if len(events) == expected else f"{len(events)} events, expected 1")
            for e in events:
                f.check(f"{name}: async", None if e.is_async else "not async")
                f.check(f"{name}: count", None if e.count == 1 else f"count {e.count}")
                f.check(f"{name}: shapes", None if e.input_shapes == shapes else f"{e.input_shapes}, expected {shapes}")
        dist.barrier()
    # An async op waited later records its event the same way.
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        work = dist.all_reduce(torch.ones(SHAPE), async_op=True)
        work.wait()
    events = [e for e in prof.function_events if e.name == "pycomm:all_reduce"]
    f.check("async all_reduce: one event", None if len(events) == 1 else f"{len(events)} events")
    return f.result()


def chrome_trace_worker(rank: int, world: int) -> tuple[list[str], int]:
    f = Failures(rank)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        dist.all_reduce(torch.ones(SHAPE))
        dist.broadcast(torch.ones(SHAPE), 0)
    names = [e.name for e in prof.events()]
    for op in ("all_reduce", "broadcast"):
        f.check(f"torch.profiler {op}", None if f"pycomm:{op}" in names else f"no pycomm:{op} in {sorted(set(names))}")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as fh:
            trace = json.load(fh)
    traced = [e for e in trace["traceEvents"] if e.get("name") == "pycomm:all_reduce"]
    f.check("Chrome trace: pycomm:all_reduce", None if traced else "missing")
    for e in traced:
        shapes = e.get("args", {}).get("Input Dims")
        f.check("Chrome trace: input dims", None if shapes == [SHAPE] else f"{shapes}")
    return f.result()


def test_autograd_profiler_records_one_async_event_per_op_with_shapes() -> None:
    assert_no_failures(run_ranks(autograd_profiler_worker, 3, backend="pycomm", timeout_s=TIMEOUT_S))


def test_torch_profiler_and_chrome_trace_name_the_ops() -> None:
    assert_no_failures(run_ranks(chrome_trace_worker, 3, backend="pycomm", timeout_s=TIMEOUT_S))
