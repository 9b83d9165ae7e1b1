"""Invalid use must fail loudly and promptly, never hang or corrupt memory."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from reference import check_reduced, input_for
from support import gloo_gap

# Mismatch detection must not rely on the group timeout: make that long enough
# that an error arriving only through it is distinguishable, yet short enough
# that all cases of one spawn fit in its run_ranks timeout if it does.
MISMATCH_PG_TIMEOUT_S = 15.0
MISMATCH_MAX_S = 10.0
SILENT_PEER_PG_TIMEOUT_S = 3.0
SILENT_PEER_SLACK_S = 10.0

_OP_PATTERN = {
    "all_reduce": r"all_?reduce",
    "all_gather_into_tensor": r"all_?gather",
}
_MISMATCH_CASES = [
    (op, kind)
    for op in ("all_reduce", "all_gather_into_tensor")
    for kind in ("count", "dtype")
]


def _one_mismatch(
    rank: int, world: int, op: str, kind: str, group: dist.ProcessGroup | None
) -> dict[str, Any]:
    """Rank 1 disagrees with the others on the element count (10 vs 12) or the dtype."""
    odd = rank == 1
    n = 12 if kind == "count" and odd else 10
    dtype = torch.float64 if kind == "dtype" and odd else torch.float32
    result: dict[str, Any] = {"error": None, "after": None}
    start = time.monotonic()
    try:
        if op == "all_reduce":
            dist.all_reduce(torch.ones(n, dtype=dtype), group=group)
        else:
            dist.all_gather_into_tensor(
                torch.empty(n * world, dtype=dtype),
                torch.ones(n, dtype=dtype),
                group=group,
            )
    except Exception as exc:  # noqa: BLE001  (the parent checks the type)
        result["error"] = (type(exc).__name__, isinstance(exc, RuntimeError), str(exc))
    result["elapsed"] = time.monotonic() - start
    # The promise: a detected mismatch leaves the group usable.
    inputs = [input_for(5, r, (4099,), torch.float32, "sum") for r in range(world)]
    t = inputs[rank].clone()
    try:
        dist.all_reduce(t, group=group)
        result["after"] = check_reduced(t, inputs, "sum")
    except Exception as exc:  # noqa: BLE001
        result["after"] = f"raised {type(exc).__name__}: {exc}"
    return result


def _mismatch_worker(rank: int, world: int, backend: str) -> list[dict[str, Any]]:
    """Every mismatch case in turn, on the default group and (pycomm) a TCP-only group.

    On one host pycomm's default group runs collectives over shared memory, so
    the TCP group is needed to cover the network path's mismatch detection.
    """
    groups: list[tuple[str, dist.ProcessGroup | None]] = [("default group", None)]
    if backend == "pycomm":
        import pycomm

        tcp = dist.new_group(
            list(range(world)), pg_options=pycomm.Options(transport="tcp")
        )
        groups.append(("tcp group", tcp))
    results = []
    for group_name, group in groups:
        for op, kind in _MISMATCH_CASES:
            res = _one_mismatch(rank, world, op, kind, group)
            res["case"] = f"{group_name} {op} {kind} mismatch"
            res["op"], res["kind"] = op, kind
            results.append(res)
    return results


def _mismatch_problems(rank: int, res: dict[str, Any]) -> list[str]:
    where = f"rank {rank}, {res['case']}"
    if res["error"] is None:
        return [f"{where}: no error raised"]
    problems = []
    name, is_runtime_error, message = res["error"]
    if not is_runtime_error:
        problems.append(f"{where}: raised {name}, not RuntimeError: {message}")
    if not re.search(_OP_PATTERN[res["op"]], message, re.IGNORECASE):
        problems.append(f"{where}: message does not name the op: {message!r}")
    if res["kind"] == "count" and not (
        re.search(r"\b10\b", message) and re.search(r"\b12\b", message)
    ):
        problems.append(
            f"{where}: message does not give both counts (10 and 12): {message!r}"
        )
    if res["elapsed"] > MISMATCH_MAX_S:
        problems.append(
            f"{where}: error took {res['elapsed']:.1f}s (group timeout {MISMATCH_PG_TIMEOUT_S}s)"
        )
    if res["after"] is not None:
        problems.append(
            f"{where}: group unusable after the mismatch error: {res['after']}"
        )
    return problems


@pytest.mark.parametrize("world", [2, 3])
def test_mismatch_raises_on_every_rank(backend: str, world: int) -> None:
    """Mismatched counts / dtypes for all_reduce and all_gather_into_tensor."""
    if gloo_gap(backend, "mismatch_aborts"):
        pytest.skip("gloo aborts the process (gloo::EnforceNotMet) on a size mismatch")
    results = run_ranks(
        _mismatch_worker,
        world,
        backend=backend,
        timeout_s=240,
        pg_timeout_s=MISMATCH_PG_TIMEOUT_S,
        args=(backend,),
    )
    problems = [
        p
        for rank, cases in enumerate(results)
        for res in cases
        for p in _mismatch_problems(rank, res)
    ]
    assert not problems, "\n".join(problems)


def _silent_peer_worker(rank: int, world: int, op: str) -> Any:
    """Rank 1 stays alive but never joins the op; rank 0 must time out naming it."""
    store = dist.distributed_c10d._get_default_store()
    if rank != 0:
        # The store outlives the broken group; wait well past the group timeout.
        store.wait(["rank0-done"], timedelta(seconds=60))
        store.set("rank1-saw-done", "1")  # rank 0 hosts the store: it waits for this before exiting
        return None
    start = time.monotonic()
    error = None
    try:
        if op == "all_reduce":
            dist.all_reduce(torch.ones(1000))
        else:
            dist.recv(torch.empty(1000), src=1)
    except Exception as exc:  # noqa: BLE001
        error = (type(exc).__name__, isinstance(exc, RuntimeError), str(exc))
    elapsed = time.monotonic() - start
    store.set("rank0-done", "1")
    store.wait(["rank1-saw-done"], timedelta(seconds=60))
    return error, elapsed


@pytest.mark.parametrize(
    ("op", "transport"),
    # On one host pycomm's all_reduce goes over shared memory unless transport="tcp".
    [("all_reduce", "auto"), ("all_reduce", "tcp"), ("recv", "auto")],
)
def test_silent_peer_times_out(
    request: pytest.FixtureRequest, backend: str, op: str, transport: str
) -> None:
    pg_options = None
    if backend == "pycomm":
        pg_options = request.getfixturevalue("pycomm").Options(transport=transport)
    elif transport != "auto":
        pytest.skip("transport is a pycomm option")
    # destroy=False: after a timeout the group need not be usable, not even for teardown.
    results = run_ranks(
        _silent_peer_worker,
        2,
        backend=backend,
        timeout_s=60,
        pg_timeout_s=SILENT_PEER_PG_TIMEOUT_S,
        pg_options=pg_options,
        destroy=False,
        args=(op,),
    )
    error, elapsed = results[0]
    assert error is not None, (
        f"{op} with a silent peer returned after {elapsed:.1f}s without error"
    )
    name, is_runtime_error, message = error
    assert is_runtime_error, f"raised {name}, not RuntimeError: {message}"
    assert elapsed >= 0.8 * SILENT_PEER_PG_TIMEOUT_S, (
        f"gave up after {elapsed:.1f}s, before the timeout"
    )
    assert elapsed <= SILENT_PEER_PG_TIMEOUT_S + SILENT_PEER_SLACK_S, (
        f"took {elapsed:.1f}s"
    )
    if not gloo_gap(backend, "timeout_names_peer"):
        assert re.search(r"peer.*1", message, re.IGNORECASE | re.DOTALL), (
            f"timeout message does not name peer 1: {message!r}"
        )


@pytest.mark.parametrize(
    ("field", "valid"),
    [
        ("algorithm", ("auto", "ring")),
        ("transport", ("auto", "tcp", "shm")),
        ("cuda_transport", ("auto", "nccl", "staged")),
        ("debug", ("WARN", "INFO", "TRACE")),
    ],
)
def test_unknown_option_value(
    pycomm: ModuleType, field: str, valid: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError) as info:
        pycomm.Options(**{field: "bogus"})
    message = str(info.value)
    missing = [v for v in valid if v not in message]
    assert not missing, (
        f"ValueError for {field}='bogus' does not list {missing}: {message!r}"
    )


@pytest.mark.parametrize("value", [-1, "ten", 3_600_001])
def test_bad_tcp_linger(pycomm: ModuleType, value: object) -> None:
    with pytest.raises(ValueError, match="tcp_linger_ms"):
        pycomm.Options(tcp_linger_ms=value)


def test_cuda_chunk_bytes(pycomm: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """The NCCL route's own grain: 16 MiB unless set, from the option or the environment, never
    below the 4 KiB that chunk_bytes allows; a group takes it (the core reads the key)."""
    monkeypatch.delenv("PYCOMM_CUDA_CHUNK_BYTES", raising=False)
    assert pycomm.Options().resolved().cuda_chunk_bytes == 16 << 20
    assert pycomm.Options().resolved().chunk_bytes == 512 << 10  # the CPU's grain is its own
    assert pycomm.Options(cuda_chunk_bytes=1 << 20).resolved().cuda_chunk_bytes == 1 << 20
    monkeypatch.setenv("PYCOMM_CUDA_CHUNK_BYTES", "65536")
    assert pycomm.Options().resolved().cuda_chunk_bytes == 65536
    with pytest.raises(ValueError, match="cuda_chunk_bytes"):
        pycomm.Options(cuda_chunk_bytes=4095)
    monkeypatch.setenv("PYCOMM_CUDA_CHUNK_BYTES", "100")
    with pytest.raises(ValueError, match="PYCOMM_"):
        pycomm.Options().resolved()


def test_tcp_linger_from_the_environment(pycomm: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYCOMM_TCP_LINGER_MS", "0")
    assert pycomm.Options().resolved().tcp_linger_ms == 0  # 0 is a value, not "unset"
    monkeypatch.delenv("PYCOMM_TCP_LINGER_MS")
    assert pycomm.Options().resolved().tcp_linger_ms == 10
    monkeypatch.setenv("PYCOMM_TCP_LINGER_MS", "-5")
    with pytest.raises(ValueError, match="PYCOMM_"):
        pycomm.Options().resolved()
