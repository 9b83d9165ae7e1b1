"""Ranks that share a host name, a boot and a network namespace but not /dev/shm (containers on the
host network: docker --network host, Kubernetes hostNetwork) must not try to share memory, and a
group whose segment some rank cannot map must fall back to its connections, on every rank alike.

One rank gets a /dev/shm of its own: a private mount namespace (unshare) with a fresh tmpfs on
/dev/shm, made by the rank's main thread before it creates the group (needs root, as the suite
runs in CI; skipped otherwise).
"""

from __future__ import annotations

import ctypes
import os
import time
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from support import private_mounts

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a private /dev/shm needs root (unshare, mount)")


def _own_dev_shm() -> None:
    """This thread (the rank's main thread, which creates groups) gets its own empty /dev/shm."""
    libc = private_mounts()
    if libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", 0, b"size=64m") != 0:
        raise OSError(ctypes.get_errno(), "mount tmpfs /dev/shm")


def _checked(group: Any, rank: int, world: int) -> str:
    t = torch.arange(70_001, dtype=torch.int64) * (rank + 1)
    dist.all_reduce(t, group=group)
    ok = torch.equal(t, torch.arange(70_001, dtype=torch.int64) * (world * (world + 1) // 2))
    return "ok" if ok else "wrong result"


def _private_shm_worker(rank: int, world: int, host_id: str | None, transport: str) -> dict[str, Any]:
    import pycomm

    if rank == world - 1:
        _own_dev_shm()
    if host_id is not None:
        os.environ["PYCOMM_HOST_ID"] = host_id  # the same id on every rank: mapping must fail and say so
    out: dict[str, Any] = {"host_id": pycomm.backend.host_id()}
    start = time.monotonic()
    try:
        group = dist.new_group(list(range(world)), pg_options=pycomm.Options(transport=transport))
        out["result"] = _checked(group, rank, world)
        out["shm_ring_bytes"] = pycomm.stats(group).get("transport/shm_ring", {}).get("bytes_sent", 0)
    except Exception as exc:  # noqa: BLE001
        out["result"] = f"raised {type(exc).__name__}: {exc}"
    out["elapsed"] = time.monotonic() - start
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_a_rank_with_its_own_dev_shm_is_another_host(pycomm: ModuleType, world: int) -> None:
    results = run_ranks(
        _private_shm_worker, world, backend="pycomm", timeout_s=90, pg_timeout_s=20, args=(None, "auto"), destroy=False
    )
    assert results[0]["host_id"] != results[-1]["host_id"], results
    assert all(r["result"] == "ok" for r in results), results


@pytest.mark.parametrize("world", [2, 3])
def test_a_segment_that_some_rank_cannot_map_means_sockets_for_all(pycomm: ModuleType, world: int) -> None:
    results = run_ranks(
        _private_shm_worker, world, backend="pycomm", timeout_s=90, pg_timeout_s=20, args=("same", "auto"),
        destroy=False,
    )
    assert all(r["result"] == "ok" for r in results), results
    assert all(r["shm_ring_bytes"] == 0 for r in results), f"some rank still used shared memory: {results}"
    assert all(r["elapsed"] < 10 for r in results), results


def test_transport_shm_that_cannot_map_raises_on_every_rank(pycomm: ModuleType) -> None:
    results = run_ranks(
        _private_shm_worker, 2, backend="pycomm", timeout_s=90, pg_timeout_s=20, args=("same", "shm"), destroy=False
    )
    for r in results:
        assert "do not share one /dev/shm" in r["result"] and r["elapsed"] < 10, results
