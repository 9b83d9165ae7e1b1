"""torch.ops.pycomm.direct_all_reduce_ (pycomm.direct_all_reduce): the synchronous all-reduce with
no c10d Work, for tight loops.

Its promise is dist.all_reduce's result, bit for bit, in issue order with the group's other ops,
and the same failure behaviour: bad input raises here and fails the peers' op at once, and a peer
that never comes fails it at the group timeout. Results are also checked against float64 (int64
for integers) references built from every rank's deterministic input (reference.py's tolerances).
A torch.compile'd function that calls the op traces it as one node and matches eager bit for bit.
pycomm.direct_all_reduce calls the kernel from C++ when nothing would run before it (no mode, no
subclass, nothing for autograd), and the torch op otherwise, and when traced.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from reference import check_equal, input_for, reduced_checker
from support import problem_notes, reduce_op

TIMEOUT_S = 120
# Element counts: empty, one, small primes, and one above the shared-memory slot's small-op path.
COUNTS = (0, 1, 7, 1031, 65537)
# (dtype, ops): every op the direct op names, over float and integer dtypes (bool SUM is OR).
CASES = [
    (torch.float32, ("sum", "avg", "product", "min", "max")),
    (torch.float64, ("sum", "max")),
    (torch.bfloat16, ("sum", "min")),
    (torch.int32, ("sum", "product", "band", "bor", "bxor")),
    (torch.int8, ("sum", "max")),
    (torch.bool, ("sum",)),
]


def _results_worker(rank: int, world: int) -> list[str]:
    import pycomm

    problems, note = problem_notes()
    group_name = dist.group.WORLD.group_name
    seed = 0
    for dtype, ops in CASES:
        for op in ops:
            for count in COUNTS:
                seed += 1
                what = f"{op} {dtype} x{count}"
                inputs = [input_for(seed, r, (count,), dtype, op) for r in range(world)]
                direct = inputs[rank].clone()
                # Alternate the Python helper and the raw torch op with names resolved once.
                if seed % 2:
                    returned = pycomm.direct_all_reduce(direct, reduce_op(op))
                    note(f"{what}: returns its tensor", None if returned is direct else "another tensor")
                else:
                    torch.ops.pycomm.direct_all_reduce_(direct, op, group_name)
                note(f"{what} vs reference", reduced_checker(inputs, op)(direct))
                eager = inputs[rank].clone()
                dist.all_reduce(eager, op=reduce_op(op))
                note(f"{what} vs dist.all_reduce", check_equal(direct, eager))
    # A non-contiguous view is reduced in place, as dist.all_reduce does it.
    inputs = [input_for(999, r, (9, 4), torch.float32, "sum") for r in range(world)]
    base = inputs[rank].clone()
    pycomm.direct_all_reduce(base.t())
    note("transposed view vs reference", reduced_checker(inputs, "sum")(base))
    return problems


@pytest.mark.parametrize("world", [1, 3, 5])
def test_results(pycomm: object, world: int) -> None:
    per_rank = run_ranks(_results_worker, world, backend="pycomm", timeout_s=TIMEOUT_S * (1 + world // 3))
    failures = [f"rank {rank}: {p}" for rank, problems in enumerate(per_rank) for p in problems]
    assert not failures, "\n".join(failures)


def _tcp_worker(rank: int, world: int) -> list[str]:
    import pycomm

    problems, note = problem_notes()
    for seed, count in enumerate((1, 1031, 300007)):
        inputs = [input_for(seed, r, (count,), torch.float32, "sum") for r in range(world)]
        direct = inputs[rank].clone()
        pycomm.direct_all_reduce(direct)
        eager = inputs[rank].clone()
        dist.all_reduce(eager)
        note(f"tcp x{count} vs reference", reduced_checker(inputs, "sum")(direct))
        note(f"tcp x{count} vs dist.all_reduce", check_equal(direct, eager))
    return problems


def test_results_over_tcp(pycomm: Any) -> None:
    per_rank = run_ranks(_tcp_worker, 3, backend="pycomm", timeout_s=TIMEOUT_S,
                         pg_options=pycomm.Options(transport="tcp"))
    failures = [f"rank {rank}: {p}" for rank, problems in enumerate(per_rank) for p in problems]
    assert not failures, "\n".join(failures)


def _order_worker(rank: int, world: int) -> list[str]:
    """An async all-reduce queued on the worker, then the direct op on part of the same tensor, then
    another async op on another part: each must run after the one issued before it. Run out of
    order (or at once), the direct op would reduce the inputs (or a torn mix) instead of the first
    op's sums, and every element it reduces would be off by the factor `world`."""
    import pycomm

    problems, note = problem_notes()
    big = [input_for(1, r, (1 << 20,), torch.float32, "sum") for r in range(world)]
    summed = torch.stack([x.double() for x in big]).sum(0)
    # What each stage yields, in float64: the second and third reduce the first's (equal) sums.
    expected_first = summed
    expected_again = world * summed
    tol = 1e-5 * world * torch.stack([x.double().abs() for x in big]).sum(0) + 1e-6
    for round_ in range(5):
        t = big[rank].clone()
        first = dist.all_reduce(t, async_op=True)
        pycomm.direct_all_reduce(t[:4099])
        later = dist.all_reduce(t[-4099:], async_op=True)
        first.wait()
        later.wait()
        for label, got, want, band in (
            ("direct op after the async op", t[:4099], expected_again[:4099], tol[:4099] * world),
            ("untouched middle", t[4099:-4099], expected_first[4099:-4099], tol[4099:-4099]),
            ("async op after the direct op", t[-4099:], expected_again[-4099:], tol[-4099:] * world),
        ):
            bad = int(((got.double() - want).abs() > band).sum())
            note(f"round {round_}: {label}", f"{bad} of {got.numel()} elements wrong" if bad else None)
    return problems


def test_issue_order_with_async_ops(pycomm: object) -> None:
    per_rank = run_ranks(_order_worker, 3, backend="pycomm", timeout_s=TIMEOUT_S)
    failures = [f"rank {rank}: {p}" for rank, problems in enumerate(per_rank) for p in problems]
    assert not failures, "\n".join(failures)


def _bad_input_worker(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 passes what the op refuses; the others a valid tensor. Every rank raises at once, and
    the group then works."""
    import pycomm

    outcome: dict[str, Any] = {}
    cases = [
        ("unknown op", lambda t: torch.ops.pycomm.direct_all_reduce_(t, "median", dist.group.WORLD.group_name)),
        ("bitwise op on floats", lambda t: pycomm.direct_all_reduce(t, dist.ReduceOp.BAND)),
        ("wrong count", lambda t: pycomm.direct_all_reduce(torch.ones(12))),
        ("sparse tensor", lambda t: pycomm.direct_all_reduce(t.to_sparse())),
    ]
    for label, bad in cases:
        t = torch.ones(10)
        start = time.monotonic()
        try:
            if rank == 1:
                bad(t)
            else:
                pycomm.direct_all_reduce(t)
            outcome[label] = ("no error", time.monotonic() - start)
        except Exception as exc:  # noqa: BLE001  (the parent checks the type)
            outcome[label] = (f"{type(exc).__name__}: {exc}", time.monotonic() - start)
    after = torch.full((5,), float(rank))
    pycomm.direct_all_reduce(after)
    outcome["after"] = after.tolist()
    return outcome


BAD_INPUT_PG_TIMEOUT_S = 30.0  # an error that only the timeout brings would show as a slow one
PROMPT_S = 10.0


def test_bad_input_fails_every_rank_promptly(pycomm: object) -> None:
    results = run_ranks(_bad_input_worker, 3, backend="pycomm", timeout_s=TIMEOUT_S,
                        pg_timeout_s=BAD_INPUT_PG_TIMEOUT_S)
    for rank, outcome in enumerate(results):
        for label in ("unknown op", "bitwise op on floats", "wrong count", "sparse tensor"):
            message, elapsed = outcome[label]
            assert message != "no error", f"rank {rank}, {label}: no error"
            assert elapsed < PROMPT_S, f"rank {rank}, {label}: raised after {elapsed:.1f}s: {message}"
        assert outcome["after"] == [3.0] * 5, f"rank {rank}: the group after the errors gave {outcome['after']}"


    # The rank that passed it is told what it passed wrong, by rank and op.
    assert "ValueError" in results[1]["unknown op"][0] and "median" in results[1]["unknown op"][0], (
        results[1]["unknown op"][0]
    )
    for label in ("unknown op", "bitwise op on floats", "sparse tensor"):
        message = results[1][label][0]
        assert "[rank 1/3] direct_all_reduce_" in message, f"{label}: {message}"


def test_refuses_a_group_of_another_backend(pycomm: Any) -> None:
    results = run_ranks(_gloo_group_worker, 2, backend="pycomm", timeout_s=TIMEOUT_S)
    for rank, message in enumerate(results):
        assert "ValueError" in message and "gloo" in message, f"rank {rank}: {message}"


def _gloo_group_worker(rank: int, world: int) -> str:
    import pycomm

    gloo = dist.new_group(backend="gloo")
    try:
        pycomm.direct_all_reduce(torch.ones(3), group=gloo)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _routes_worker(rank: int, world: int) -> list[str]:
    """pycomm.direct_all_reduce calls the op's kernel from C++ only where the dispatcher would go
    straight to it; a dispatch mode, a profiler, a Tensor subclass, a TorchFunctionMode, autograd
    and inference tensors get what torch.ops gives them. Each case is checked against the float64 reference."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    import pycomm

    class SeenOps(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    problems, note = problem_notes()
    inputs = [input_for(500, r, (1031,), torch.float32, "sum") for r in range(world)]
    expect = reduced_checker(inputs, "sum")

    t = inputs[rank].clone()
    with SeenOps() as mode:
        pycomm.direct_all_reduce(t)
    note("under a dispatch mode", expect(t))
    note("the mode saw the op", None if mode.ops == ["pycomm.direct_all_reduce_.default"] else str(mode.ops))

    t = inputs[rank].clone()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        pycomm.direct_all_reduce(t)
    note("under a profiler", expect(t))
    events = [e.name for e in profiler.events()]
    note("the profiler saw the op", None if "pycomm::direct_all_reduce_" in events else str(events))

    class Traced(torch.Tensor):
        calls: list[str] = []

        @classmethod
        def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            cls.calls.append(str(func))
            return super().__torch_function__(func, types, args, kwargs or {})

    traced = inputs[rank].clone().as_subclass(Traced)
    pycomm.direct_all_reduce(traced)
    note("a subclass with __torch_function__", expect(traced.as_subclass(torch.Tensor)))
    seen = [c for c in Traced.calls if "direct_all_reduce_" in c]
    note("its __torch_function__ saw the op", None if seen else str(Traced.calls))

    class SeenFunctions(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.funcs: list[str] = []

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.funcs.append(str(func))
            return func(*args, **(kwargs or {}))

    t = inputs[rank].clone()
    with SeenFunctions() as function_mode:
        pycomm.direct_all_reduce(t)
    note("under a TorchFunctionMode", expect(t))
    seen = [f for f in function_mode.funcs if "direct_all_reduce_" in f]
    note("the TorchFunctionMode saw the op", None if seen else str(function_mode.funcs))

    parameter = torch.nn.Parameter(inputs[rank].clone(), requires_grad=False)
    pycomm.direct_all_reduce(parameter)
    note("a Parameter (a Tensor subclass)", expect(parameter))

    leaf = inputs[rank].clone().requires_grad_()
    scaled = leaf * 1
    pycomm.direct_all_reduce(scaled)
    note("a tensor autograd records", expect(scaled.detach()))

    with torch.inference_mode():
        t = inputs[rank].clone()
        pycomm.direct_all_reduce(t)
    note("an inference tensor", expect(t))

    # Which tensors, on this thread, the C++ route hands to the kernel at once: where the dispatcher
    # would call nothing else first. Every other case above goes through the dispatcher.
    calls_kernel = pycomm._C._direct_all_reduce_calls_kernel
    plain = inputs[rank].clone()
    straight = {"a plain tensor": calls_kernel(plain), "a tensor that requires grad, no_grad": False,
                "inference mode": False, "autocast": False}
    with torch.no_grad():
        straight["a tensor that requires grad, no_grad"] = calls_kernel(leaf)
    with torch.inference_mode():
        straight["inference mode"] = calls_kernel(torch.ones(3)) and calls_kernel(plain)
    with torch.autocast("cpu"):
        straight["autocast"] = calls_kernel(plain)
    for label, taken in straight.items():
        note(f"{label}: the kernel at once", None if taken else "dispatched")
    with SeenOps():
        dispatched = {"a dispatch mode": calls_kernel(plain)}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        dispatched["a profiler"] = calls_kernel(plain)
    dispatched["a tensor autograd records"] = calls_kernel(scaled)
    dispatched["a meta tensor"] = calls_kernel(torch.ones(3, device="meta"))
    dispatched["a sparse tensor"] = calls_kernel(plain.to_sparse())
    dispatched["a conjugate view"] = calls_kernel(torch.ones(3, dtype=torch.complex64).conj())
    dispatched["under vmap"] = False
    torch.func.vmap(lambda x: dispatched.__setitem__("under vmap", calls_kernel(x)) or x)(torch.ones(2, 3))
    for label, taken in dispatched.items():
        note(f"{label}: dispatched", "the kernel at once" if taken else None)

    # Every op by its ReduceOp, on the C++ route: the name the wrapper passes is the op's.
    for op in ("sum", "product", "min", "max", "avg"):
        t = inputs[rank].clone()
        pycomm.direct_all_reduce(t, reduce_op(op), dist.group.WORLD)
        note(f"{op} by ReduceOp", reduced_checker(inputs, op)(t))
    return problems


def test_wrapper_routes(pycomm: object) -> None:
    per_rank = run_ranks(_routes_worker, 3, backend="pycomm", timeout_s=TIMEOUT_S)
    failures = [f"rank {rank}: {p}" for rank, problems in enumerate(per_rank) for p in problems]
    assert not failures, "\n".join(failures)


SILENT_PG_TIMEOUT_S = 3.0
SILENT_SLACK_S = 15.0


def _silent_peer_worker(rank: int, world: int) -> Any:
    """Rank 1 never joins. Rank 0 queues an async op and then the direct op behind it: the direct
    op waits for the queued one, which ends at the timeout; then it fails itself, and returns."""
    import pycomm

    store = dist.distributed_c10d._get_default_store()
    if rank != 0:
        store.wait(["rank0-done"], timedelta(seconds=90))
        store.set("rank1-saw-done", "1")
        return None
    work = dist.all_reduce(torch.ones(1000), async_op=True)
    start = time.monotonic()
    error = "no error"
    try:
        pycomm.direct_all_reduce(torch.ones(10))
    except Exception as exc:  # noqa: BLE001
        error = f"{type(exc).__name__}: {exc}"
    elapsed = time.monotonic() - start
    try:
        work.wait()
    except Exception:  # noqa: BLE001  (its own timeout: checked by test_bad_input)
        pass
    store.set("rank0-done", "1")
    store.wait(["rank1-saw-done"], timedelta(seconds=90))
    return error, elapsed


def test_silent_peer_fails_a_queued_direct_op(pycomm: object) -> None:
    results = run_ranks(_silent_peer_worker, 2, backend="pycomm", timeout_s=90,
                        pg_timeout_s=SILENT_PG_TIMEOUT_S, destroy=False)
    error, elapsed = results[0]
    assert error != "no error", f"returned after {elapsed:.1f}s without error"
    assert "RuntimeError" in error or "DistBackendError" in error, error
    assert elapsed <= 2 * SILENT_PG_TIMEOUT_S + SILENT_SLACK_S, f"took {elapsed:.1f}s: {error}"


COMPILED_ROWS = 7


def _step(x: torch.Tensor, group_name: str) -> torch.Tensor:
    y = x * 2 + 1
    torch.ops.pycomm.direct_all_reduce_(y, "sum", group_name)
    return torch.sin(y) + x


def _wrapper_step(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    import pycomm

    y = x * 2 + 1
    pycomm.direct_all_reduce(y, dist.ReduceOp.SUM, group)
    return torch.sin(y) + x


def _compiled_worker(rank: int, world: int) -> dict[str, Any]:
    from torch._dynamo.testing import CompileCounterWithBackend

    import pycomm  # noqa: F401  (registers torch.ops.pycomm)

    inputs = [input_for(300, r, (COMPILED_ROWS, 5), torch.float32, "sum") for r in range(world)]
    reference = torch.sin(torch.stack([2 * x.double() + 1 for x in inputs]).sum(0)) + inputs[rank].double()
    results = {}
    # The torch op itself, and pycomm.direct_all_reduce, which must take the op when traced.
    for label, step, group in (("op", _step, dist.group.WORLD.group_name), ("wrapper", _wrapper_step, dist.group.WORLD)):
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(step, backend=counter, fullgraph=True)
        first = compiled(inputs[rank], group)
        again = compiled(inputs[rank], group)
        eager = step(inputs[rank], group)
        targets = {str(node.target) for graph in counter.graphs for node in graph.graph.nodes}
        results[label] = {
            "frames": counter.frame_count,
            "traced": any("direct_all_reduce_" in t for t in targets),
            "vs eager": check_equal(first, eager),
            "again vs eager": check_equal(again, eager),
            "vs float64": float((eager.double() - reference).abs().max()),
        }
    return results


# float32 sum of 3 values |2x + 1| < 10 off by a few ulps of 30, through sin: measured 1e-6 or so.
COMPILED_REFERENCE_TOL = 1e-5


def test_torch_compile_traces_the_op(pycomm: object) -> None:
    results = run_ranks(_compiled_worker, 3, backend="pycomm", timeout_s=TIMEOUT_S)
    for rank, by_entry in enumerate(results):
        for entry, result in by_entry.items():
            where = f"rank {rank}, {entry}"
            assert result["frames"] == 1, f"{where}: {result['frames']} compiled frames (a graph break?)"
            assert result["traced"], f"{where}: the graph does not hold the direct op"
            assert result["vs eager"] is None, f"{where}: compiled vs eager: {result['vs eager']}"
            assert result["again vs eager"] is None, f"{where}: again vs eager: {result['again vs eager']}"
            assert result["vs float64"] <= COMPILED_REFERENCE_TOL, f"{where}: vs float64: {result['vs float64']}"
