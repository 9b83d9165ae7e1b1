"""Ops without a shared-memory collective of their own (send/recv, all-to-all, gather, scatter,
reduce) between ranks of one host: their frames go through the shared-memory rings, not through
the sockets, and arrive intact, also when a message is many times a ring's capacity."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from reference import check_equal, check_reduced, input_for
from stalling_store import stall_pycomm_store
from support import Failures, assert_no_failures

TIMEOUT_S = 120
RING_BYTES = 2 << 20  # the largest ring capacity (Config::shmRingBytes; world 3 gets 16 MiB / 9)
# Element counts: empty, one, a prime, and 16 MiB + 3 of float32 (eight ring capacities).
COUNTS = (0, 1, 4099, (16 << 20) // 4 + 3)


def _bytes_by_path() -> tuple[int, int]:
    import pycomm

    stats = pycomm.stats()
    return int(stats["transport/socket"]["bytes_sent"]), int(stats["transport/shm_ring"]["bytes_sent"])


def _worker(rank: int, world: int) -> tuple[list[str], int, dict[str, int]]:
    f = Failures(rank)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    socket_before, ring_before = _bytes_by_path()
    payload = 0  # bytes this rank sends in the ops below
    for k, n in enumerate(COUNTS):
        label = f"isend/irecv {n}"
        with f.guard(label):
            sent = input_for(k, rank, (n,), torch.float32, None)
            got = torch.full((n,), float("nan"))
            reqs = [dist.isend(sent, nxt), dist.irecv(got, prv)]
            for r in reqs:
                r.wait()
            f.check(label, check_equal(got, input_for(k, prv, (n,), torch.float32, None)))
            payload += 4 * n

        label = f"all_to_all_single uneven {n}"
        with f.guard(label):
            # Rank r sends (n + r + q) % 7 + q * n // world elements to rank q.
            def split(src: int, dst: int) -> int:
                return (n + src + dst) % 7 + dst * n // (world * world)

            send_splits = [split(rank, q) for q in range(world)]
            recv_splits = [split(q, rank) for q in range(world)]
            inp = torch.cat([input_for(100 + k, rank * world + q, (send_splits[q],), torch.int64, None)
                             for q in range(world)])
            out = torch.full((sum(recv_splits),), -1, dtype=torch.int64)
            dist.all_to_all_single(out, inp, recv_splits, send_splits)
            expected = torch.cat([input_for(100 + k, q * world + rank, (recv_splits[q],), torch.int64, None)
                                  for q in range(world)])
            f.check(label, check_equal(out, expected))
            payload += 8 * (sum(send_splits) - send_splits[rank])

        label = f"gather/scatter/reduce {n}"
        with f.guard(label):
            root = k % world
            mine = input_for(200 + k, rank, (n,), torch.int64, None)
            gathered = [torch.empty(n, dtype=torch.int64) for _ in range(world)] if rank == root else None
            dist.gather(mine, gathered, dst=root)
            if rank == root:
                for q in range(world):
                    f.check(label + f" gather from {q}", check_equal(gathered[q], input_for(200 + k, q, (n,), torch.int64, None)))
            pieces = [input_for(300 + k, q, (n,), torch.int64, None) for q in range(world)] if rank == root else None
            part = torch.empty(n, dtype=torch.int64)
            dist.scatter(part, pieces, src=root)
            f.check(label + " scatter", check_equal(part, input_for(300 + k, rank, (n,), torch.int64, None)))
            total = mine.clone()
            dist.reduce(total, dst=root)
            if rank == root:
                expected = sum(input_for(200 + k, q, (n,), torch.int64, None) for q in range(world))
                f.check(label + " reduce", check_equal(total, expected))
            # Lower bound of what this rank sent: its gather part, or the scatter's pieces.
            payload += 8 * n if rank != root else 8 * n * (world - 1)
    dist.barrier()
    socket_after, ring_after = _bytes_by_path()
    failures, checks = f.result()
    return failures, checks, {"socket": socket_after - socket_before, "ring": ring_after - ring_before,
                              "payload": payload}


@pytest.mark.usefixtures("pycomm")
@pytest.mark.parametrize("world", [2, 3])
def test_other_ops_go_through_the_rings(world: int) -> None:
    results = run_ranks(_worker, world, backend="pycomm", timeout_s=TIMEOUT_S)
    assert_no_failures([(failures, checks) for failures, checks, _ in results])
    for rank, (_, _, sent) in enumerate(results):
        assert sent["payload"] > 4 * RING_BYTES
        assert sent["ring"] >= sent["payload"], (rank, sent)
        assert sent["socket"] == 0, (rank, sent)  # doorbells are not frames


def _tcp_worker(rank: int, world: int) -> dict[str, int]:
    t = torch.arange(1000, dtype=torch.float32)
    dist.broadcast(t, src=0)
    out = torch.empty(1000 * world)
    dist.all_to_all_single(out, t.repeat(world))
    socket, ring = _bytes_by_path()
    return {"socket": socket, "ring": ring}


@pytest.mark.usefixtures("pycomm")
def test_forced_tcp_uses_no_ring(pycomm: Any) -> None:
    results = run_ranks(_tcp_worker, 2, backend="pycomm", timeout_s=TIMEOUT_S,
                        pg_options=pycomm.Options(transport="tcp"))
    for sent in results:
        assert sent["ring"] == 0 and sent["socket"] >= 4000, sent


def _in_place_reduce_scatter(rank: int, world: int) -> tuple[list[str], int]:
    """reduce_scatter_tensor whose output is this rank's block of its own input (FSDP-style flat
    buffers do this): the shared-memory path must not read a block it has already overwritten."""
    f = Failures(rank)
    for k, n in enumerate((1, 4099, 300_007)):  # one chunk, and several 1-MiB slots' worth
        for dtype in (torch.float32, torch.int64, torch.bfloat16):
            label = f"in-place reduce_scatter {n} {dtype}"
            with f.guard(label):
                inp = input_for(400 + k, rank, (world * n,), dtype, None)
                out = inp.view(world, n)[rank]
                dist.reduce_scatter_tensor(out, inp)
                blocks = [input_for(400 + k, q, (world * n,), dtype, None).view(world, n)[rank] for q in range(world)]
                f.check(label, check_reduced(out, blocks, "sum"))
    return f.result()


@pytest.mark.usefixtures("pycomm")
@pytest.mark.parametrize("world", [2, 3])
def test_in_place_reduce_scatter(world: int) -> None:
    assert_no_failures(run_ranks(_in_place_reduce_scatter, world, backend="pycomm", timeout_s=TIMEOUT_S))


def _overlapping_buffers(rank: int, world: int) -> tuple[list[str], int]:
    """all_gather_into_tensor and reduce_scatter_tensor whose input and output are views of one buffer
    that overlap elsewhere than this rank's block (gloo gets these right): the op reads the input as
    it was at the call, whatever it writes into the output meanwhile, and writes nothing outside the
    output."""
    f = Failures(rank)
    pad = 4  # elements of the buffer before the output (all-gather) or the input (reduce-scatter)
    # One step, one step of several chunks' worth, and several steps of a 1-MiB slot.
    for k, n in enumerate((1, 4099, 300_007, 1_000_003)):
        for dtype in (torch.float32, torch.int64):
            # Where the other view starts, relative to the first: before it, inside it, around this
            # rank's block. The same number on every rank (each offset is an op).
            for off in (-3, 1, 3, rank * n + 1, max(2, rank * n - 1)):
                label = f"all_gather_into_tensor {n} {dtype} input at element {off} of the output"
                with f.guard(label):
                    mine = input_for(500 + k, rank, (n,), dtype, None)
                    buf = torch.full((pad + world * n + n + 8,), -1, dtype=dtype)
                    buf[pad + off:pad + off + n] = mine
                    before = buf.clone()
                    out = buf[pad:pad + world * n]
                    dist.all_gather_into_tensor(out, buf[pad + off:pad + off + n])
                    expected = torch.cat([input_for(500 + k, q, (n,), dtype, None) for q in range(world)])
                    f.check(label, check_equal(out, expected))
                    outside = torch.cat([buf[:pad], buf[pad + world * n:]])
                    f.check(label + " (outside the output)",
                            check_equal(outside, torch.cat([before[:pad], before[pad + world * n:]])))
                label = f"reduce_scatter_tensor {n} {dtype} output at element {off} of the input"
                with f.guard(label):
                    buf = input_for(600 + k, rank, (pad + world * n + 8,), dtype, "sum")
                    before = buf.clone()
                    out = buf[pad + off:pad + off + n]
                    dist.reduce_scatter_tensor(out, buf[pad:pad + world * n])
                    blocks = [input_for(600 + k, q, (pad + world * n + 8,), dtype, "sum")[pad:pad + world * n]
                              .view(world, n)[rank] for q in range(world)]
                    f.check(label, check_reduced(out, blocks, "sum"))
                    f.check(label + " (outside the output)",
                            check_equal(torch.cat([buf[:pad + off], buf[pad + off + n:]]),
                                        torch.cat([before[:pad + off], before[pad + off + n:]])))
    return f.result()


@pytest.mark.usefixtures("pycomm")
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_overlapping_input_and_output(pycomm: Any, world: int, transport: str) -> None:
    assert_no_failures(run_ranks(_overlapping_buffers, world, backend="pycomm", timeout_s=TIMEOUT_S,
                                 pg_options=pycomm.Options(transport=transport)))


def _sender_leaves(rank: int, world: int, pid_file: str) -> tuple[list[str], int]:
    """Rank 0 is stopped (SIGSTOP) while rank 1 sends into the ring and destroys its group, then
    continued: its event loop finds the doorbell and the closed socket in one go. The message must
    still be delivered, as a socket delivers what came before its end."""
    import os
    import signal
    import time
    from pathlib import Path

    f = Failures(rank)
    n = 100_003  # 400 KB: fits in the ring, so the send completes while rank 0 is stopped
    dist.barrier()
    if rank == 0:
        Path(pid_file).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
        got = torch.full((n,), float("nan"))
        with f.guard("receive after the sender left"):
            dist.recv(got, src=1)
            f.check("receive after the sender left", check_equal(got, input_for(500, 1, (n,), torch.float32, None)))
    else:
        with f.guard("send, then leave"):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # until rank 0 is stopped
                path = Path(pid_file)
                if path.exists() and path.read_text():
                    pid = int(path.read_text())
                    if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
                        break
                time.sleep(0.01)
            dist.send(input_for(500, 1, (n,), torch.float32, None), dst=0)
            dist.destroy_process_group()
            time.sleep(0.2)  # the close reaches rank 0's socket
            os.kill(pid, signal.SIGCONT)
            f.check("send, then leave", None)
    return f.result()


@pytest.mark.usefixtures("pycomm")
def test_message_in_the_ring_outlives_its_sender(tmp_path: Any) -> None:
    assert_no_failures(run_ranks(_sender_leaves, 2, backend="pycomm", timeout_s=TIMEOUT_S, destroy=False,
                                 args=(str(tmp_path / "pid"),)))


def _forced_shm(rank: int, world: int, split_hosts: bool) -> dict[str, Any]:
    """transport="shm": shared memory for everything on one host; a clear error on every rank when
    the ranks are on several hosts (told apart here by PYCOMM_HOST_ID, as namespaces would be)."""
    import os

    import pycomm

    if split_hosts:
        os.environ["PYCOMM_HOST_ID"] = f"host{rank % 2}"
        if rank == world - 1:
            # Rank 0 (whose process holds the store) reads the host list and raises first; the
            # others must still get the clear error, not a lost store connection.
            stall_pycomm_store("pycomm/host/0", stall_s=2.0)
    try:
        group = dist.new_group(backend="pycomm", pg_options=pycomm.Options(transport="shm"))
    except Exception as error:  # noqa: BLE001 - the error itself is the result
        return {"error": f"{type(error).__name__}: {error}"}
    t = torch.arange(4099, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(t, group=group)
    out = torch.empty(4 * world)
    dist.all_to_all_single(out, torch.arange(4 * world, dtype=torch.float32) + 100 * rank, group=group)
    stats = pycomm.stats(group)
    return {"sum_ok": bool((t == torch.arange(4099) * world * (world + 1) / 2).all()),
            "alltoall_ok": out.tolist() == [100 * q + 4 * rank + i for q in range(world) for i in range(4)],
            "ring_bytes": int(stats["transport/shm_ring"]["bytes_sent"])}


@pytest.mark.usefixtures("pycomm")
def test_forced_shm_on_one_host_and_across_hosts() -> None:
    for res in run_ranks(_forced_shm, 3, backend="pycomm", timeout_s=TIMEOUT_S, args=(False,)):
        assert res == {"sum_ok": True, "alltoall_ok": True, "ring_bytes": res["ring_bytes"]} and res["ring_bytes"] > 0, res
    for res in run_ranks(_forced_shm, 4, backend="pycomm", timeout_s=TIMEOUT_S, args=(True,)):
        assert "transport=shm needs every rank on one host" in res.get("error", ""), res
        assert "use transport=auto" in res["error"], res
