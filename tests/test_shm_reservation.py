"""Shared memory is reserved where it is first written, not all at setup (transport/shm/segment.h).

A group's segment holds four slots per rank and a ring per ordered pair: 16 MiB at world 2 and 32
MiB at world 4, whose reservation on one rank was most of a subgroup's setup. Now each rank
reserves at setup the first 64 KiB of each ring it writes, the rest as it writes, and its slots as
far as its ops write them.
What that must keep: a /dev/shm without room for a segment still sends the group to its
connections at setup, and one that fills later fails an op clearly (never SIGBUS, never a hang).

The ranks share a tmpfs of the test's own, bind-mounted on /dev/shm in a private mount namespace of
each rank's main thread (root needed, as in CI; skipped otherwise), so the figures are theirs alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from support import private_mounts

MS_BIND = 4096
MIB = 1 << 20

def _reserves_partly() -> bool:
    """Whether the kernel reserves part of a mapping (MADV_POPULATE_WRITE, Linux 5.14); without it
    pycomm reserves a segment whole at setup, as it did before."""
    with mmap.mmap(-1, 4096) as page:
        try:
            page.madvise(23)  # MADV_POPULATE_WRITE
        except OSError:
            return False
    return True


pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a private /dev/shm needs root (unshare, mount)"),
    pytest.mark.skipif(not _reserves_partly(), reason="the kernel lacks MADV_POPULATE_WRITE (Linux 5.14)"),
]


@contextlib.contextmanager
def shared_tmpfs(size_mib: int) -> Iterator[str]:
    """A fresh tmpfs of `size_mib` MiB on a directory of its own, for the ranks to share."""
    where = tempfile.mkdtemp(prefix="pycomm-shm-")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", where],
                             capture_output=True, text=True)
    if mounted.returncode != 0:  # root without CAP_SYS_ADMIN (an unprivileged container)
        os.rmdir(where)
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", where], check=False)
        os.rmdir(where)


def _use_as_dev_shm(where: str) -> None:
    """This thread (the rank's main thread, which creates groups) sees `where` as /dev/shm."""
    libc = private_mounts()
    if libc.mount(where.encode(), b"/dev/shm", None, MS_BIND, None) != 0:
        raise OSError(ctypes.get_errno(), f"mount --bind {where} /dev/shm")


def _used() -> int:
    fs = os.statvfs("/dev/shm")
    return (fs.f_blocks - fs.f_bfree) * fs.f_frsize


def _sum_is_right(group: Any, rank: int, world: int, n: int) -> str:
    t = torch.arange(n, dtype=torch.int64) * (rank + 1)
    dist.all_reduce(t, group=group)
    expected = torch.arange(n, dtype=torch.int64) * (world * (world + 1) // 2)
    return "ok" if torch.equal(t, expected) else f"wrong result {t[:4].tolist()}"


def _footprint_worker(rank: int, world: int, where: str) -> dict[str, Any]:
    import pycomm

    _use_as_dev_shm(where)
    dist.barrier()  # the default group lives on the real /dev/shm, made before the switch
    before = _used()
    dist.barrier()
    group = dist.new_group(list(range(world)), pg_options=pycomm.Options(transport="shm"), timeout=timedelta(seconds=30))
    dist.barrier()
    out: dict[str, Any] = {"setup": _used() - before}
    out["small"] = _sum_is_right(group, rank, world, 1)
    dist.barrier()
    out["after_small"] = _used() - before
    out["large"] = _sum_is_right(group, rank, world, 1 << 20)  # 8 MiB: every slot, whole
    dist.barrier()
    out["after_large"] = _used() - before
    dist.destroy_process_group(group)
    return out


def test_a_group_reserves_shared_memory_as_it_writes(pycomm: ModuleType) -> None:
    world = 2
    with shared_tmpfs(64) as where:
        results = run_ranks(_footprint_worker, world, backend="pycomm", timeout_s=90, pg_timeout_s=30,
                            args=(where,))
    r = results[0]
    assert all(x["small"] == "ok" and x["large"] == "ok" for x in results), results
    # Reserving everything at setup took 16 MiB here (2 ranks x 4 slots x 1 MiB, 4 rings x 2 MiB);
    # now the controls and 64 KiB of each of the 2 rings in use; then 64 KiB per slot for a
    # one-element op, and every slot whole (8 MiB) for one that fills them.
    assert r["setup"] < 1 * MIB, f"the group reserved {r['setup']} B of /dev/shm at setup"
    assert r["after_small"] < 2 * MIB, f"a one-element all-reduce left {r['after_small']} B reserved"
    assert r["after_large"] >= 8 * MIB, f"an 8 MiB all-reduce reserved only {r['after_large']} B"


def _no_room_worker(rank: int, world: int, where: str) -> dict[str, Any]:
    import pycomm

    _use_as_dev_shm(where)
    group = dist.new_group(list(range(world)), pg_options=pycomm.Options(transport="auto"),
                           timeout=timedelta(seconds=20))
    out: dict[str, Any] = {"result": _sum_is_right(group, rank, world, 70_001)}
    out["ring_bytes"] = pycomm.stats(group).get("transport/shm_ring", {}).get("bytes_sent", 0)
    out["used"] = _used()
    return out


def test_a_dev_shm_without_room_for_the_segment_means_sockets_from_setup(pycomm: ModuleType) -> None:
    # 8 MiB of room against the 16 MiB segment of world 2: the check at setup must see it.
    with shared_tmpfs(8) as where:
        results = run_ranks(_no_room_worker, 2, backend="pycomm", timeout_s=90, pg_timeout_s=20, args=(where,),
                            destroy=False)
    assert all(r["result"] == "ok" for r in results), results
    assert all(r["ring_bytes"] == 0 for r in results), f"some rank used shared memory: {results}"
    assert all(r["used"] == 0 for r in results), f"a segment was left in /dev/shm: {results}"


def _run_op(op: str, group: Any, rank: int, world: int) -> str:
    if op == "all_reduce":
        return _sum_is_right(group, rank, world, 1 << 18)  # 2 MiB: past the slots' first reservation
    # One element per rank: the schedule still lays the parts out across the whole slot.
    out = torch.empty(1, dtype=torch.float32)
    dist.reduce_scatter_tensor(out, torch.arange(world, dtype=torch.float32) + rank, group=group)
    expected = float(world * rank + sum(range(world)))  # sum over ranks r of (rank + r)
    return "ok" if out.item() == expected else f"wrong result {out.item()}"


def _fills_later_worker(rank: int, world: int, where: str, op: str) -> dict[str, Any]:
    import pycomm

    _use_as_dev_shm(where)
    group = dist.new_group(list(range(world)), pg_options=pycomm.Options(transport="auto"),
                           timeout=timedelta(seconds=20))
    out: dict[str, Any] = {"before": _sum_is_right(group, rank, world, 5)}
    filler = os.path.join("/dev/shm", "filler")
    if rank == 0:
        # Everything that is left, as another program on the host might take it (written, not
        # fallocated: a fallocate that does not fit takes nothing on tmpfs).
        with open(filler, "wb", buffering=0) as f:
            for piece in (1 << 20, 4096):
                with contextlib.suppress(OSError):
                    while True:
                        f.write(b"\0" * piece)
        out["free_when_full"] = os.statvfs("/dev/shm").f_bavail
    dist.barrier()
    try:
        out["full"] = _run_op(op, group, rank, world)
    except Exception as exc:  # noqa: BLE001
        out["full"] = f"raised {type(exc).__name__}: {exc}"
    dist.barrier()
    if rank == 0:
        os.unlink(filler)
    dist.barrier()
    try:
        out["after"] = _sum_is_right(group, rank, world, 1 << 18)
    except Exception as exc:  # noqa: BLE001
        out["after"] = f"raised {type(exc).__name__}: {exc}"
    return out


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter"])
def test_a_dev_shm_that_fills_later_fails_clearly_never_sigbus(pycomm: ModuleType, op: str) -> None:
    with shared_tmpfs(24) as where:  # room for the 16 MiB segment, and 8 MiB for the filler
        results = run_ranks(_fills_later_worker, 2, backend="pycomm", timeout_s=120, pg_timeout_s=20,
                            args=(where, op), destroy=False)
    assert results[0]["free_when_full"] == 0, results  # the filler took every page
    # No rank died of SIGBUS (run_ranks would say so) or waited for the timeout: every rank's op
    # fails at once. One cannot reserve its slots and says so; the other hears that it gave shared
    # memory up, or, if it began the op after that, runs it over its connection, whose ring cannot
    # grow either, and that fails the connection, naming /dev/shm, as a socket error would.
    for r in results:
        assert r["before"] == "ok", results
        assert r["full"].startswith("raised"), results
        assert "timed out" not in r["full"], results
    assert any("/dev/shm full" in r["full"] for r in results), results
    # With the room back: over the connections (the slots were given up), right, unless the
    # connection was lost above, which then says why.
    lost = [r["full"] + r["after"] for r in results if r["after"] != "ok"]
    assert all("/dev/shm full" in text or "closed" in text for text in lost), results
