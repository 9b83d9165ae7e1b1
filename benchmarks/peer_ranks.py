"""One rank of benchmarks/peers.py: times float32 in-place SUM all-reduces of each size with one peer
library, checks one result per size against a float64 reference, and (rank 0) prints one JSON line.

Every peer is timed the same way, with its own barrier and its own max across ranks outside the
timed loops: per size, one checked call, a few warm-up calls, an iteration count calibrated on rank 0
(batches of 1, 2, 4, ... calls until one takes `--target / --reps`), then `--reps` loops of that many
calls, each after a barrier and one untimed call; a loop's time is its slowest rank's, and the size's
time the median of the loops.

    torch peers (pycomm, pycomm-direct, gloo, deepspeed): RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set
    mpi: run under mpirun
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np


class Peer:
    """What the timing needs of a library: a buffer, its all-reduce, a barrier and a max across ranks."""

    name = ""
    rank = 0
    world = 1

    def buffer(self, values: np.ndarray) -> Any:
        raise NotImplementedError

    def values(self, buf: Any) -> np.ndarray:
        raise NotImplementedError

    def allreduce(self, buf: Any) -> None:
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def max(self, value: float) -> float:
        raise NotImplementedError

    def close(self) -> None:
        pass


class MpiPeer(Peer):
    def __init__(self) -> None:
        from mpi4py import MPI

        self.mpi = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.world = self.comm.Get_rank(), self.comm.Get_size()
        # Get_version() is the MPI standard's version; the library names itself.
        self.name = MPI.Get_library_version().split(",")[0].strip()

    def buffer(self, values: np.ndarray) -> Any:
        return values.astype(np.float32)

    def values(self, buf: Any) -> np.ndarray:
        return np.asarray(buf)

    def allreduce(self, buf: Any) -> None:
        self.comm.Allreduce(self.mpi.IN_PLACE, buf, op=self.mpi.SUM)

    def barrier(self) -> None:
        self.comm.Barrier()

    def max(self, value: float) -> float:
        return float(self.comm.allreduce(value, op=self.mpi.MAX))


class TorchPeer(Peer):
    """pycomm, gloo and DeepSpeed, through torch.distributed."""

    def __init__(self, kind: str, transport: str) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.kind = torch, dist, kind
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if kind == "deepspeed":
            import deepspeed
            import deepspeed.comm as ds_comm
            from deepspeed.comm import comm as ds_state

            deepspeed.init_distributed(dist_backend="gloo", verbose=False)
            backend = ds_state.cdb
            if getattr(backend, "shm_comm_op", None) is None or getattr(backend, "shm_vector_kernel_level", 0) < 1:
                raise SystemExit("deepspeed: its shared-memory all-reduce did not load (LOCAL_SIZE, AVX2?)")
            self.ds_comm = ds_comm
            self.name = f"DeepSpeed {deepspeed.__version__} shm (inference_all_reduce)"
            return
        if kind.startswith("pycomm"):
            import pycomm

            dist.init_process_group("pycomm", pg_options=pycomm.Options(transport=transport))
            self.name = f"pycomm ({transport})"
            if kind == "pycomm-direct":
                self.group = dist.group.WORLD
                self.direct = pycomm.direct_all_reduce
                self.name = f"pycomm.direct_all_reduce ({transport})"
        else:
            dist.init_process_group("gloo")
            self.name = f"gloo (torch {torch.__version__})"

    def buffer(self, values: np.ndarray) -> Any:
        return self.torch.from_numpy(values.astype(np.float32))

    def values(self, buf: Any) -> np.ndarray:
        return buf.numpy()

    def allreduce(self, buf: Any) -> None:
        if self.kind == "pycomm-direct":
            self.direct(buf, self.dist.ReduceOp.SUM, self.group)
        elif self.kind == "deepspeed":
            self.ds_comm.inference_all_reduce(buf)
        else:
            self.dist.all_reduce(buf)

    def barrier(self) -> None:
        self.dist.barrier()

    def max(self, value: float) -> float:
        t = self.torch.tensor([value], dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t.item())

    def close(self) -> None:
        self.dist.destroy_process_group()


def pattern(rank: int, count: int) -> np.ndarray:
    """Small integers, exact in float32 summed over a few ranks."""
    return ((np.arange(count) * 7 + rank * 3) % 31 - 15).astype(np.float64)


def wrong_elements(peer: Peer, count: int) -> int:
    """This rank's elements that differ from the float64 sum (the caller takes the worst rank's)."""
    buf = peer.buffer(pattern(peer.rank, count))
    peer.allreduce(buf)
    expected = sum(pattern(r, count) for r in range(peer.world))
    return int(np.count_nonzero(peer.values(buf).astype(np.float64) != expected))


def time_size(peer: Peer, count: int, target: float, reps: int) -> float:
    buf = peer.buffer(np.zeros(count))
    call: Callable[[], None] = lambda: peer.allreduce(buf)
    for _ in range(3):
        call()
    per_rep = target / reps
    batch = 1
    while True:  # rank 0's clock decides, so every rank makes the same calls
        peer.barrier()
        start = time.perf_counter()
        for _ in range(batch):
            call()
        elapsed = peer.max(time.perf_counter() - start if peer.rank == 0 else 0.0)
        if elapsed >= per_rep or batch >= 1 << 16:
            break
        batch *= 2
    iters = max(1, min(1 << 16, round(per_rep / max(elapsed / batch, 1e-9))))
    loops = []
    for _ in range(reps):
        peer.barrier()
        call()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        loops.append(peer.max((time.perf_counter() - start) / iters))
    return statistics.median(loops)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", required=True, choices=["pycomm", "pycomm-direct", "gloo", "deepspeed", "mpi"])
    parser.add_argument("--transport", default="auto")
    parser.add_argument("--sizes", required=True, help="comma list of bytes")
    parser.add_argument("--target", type=float, default=0.2)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    peer: Peer = MpiPeer() if args.peer == "mpi" else TorchPeer(args.peer, args.transport)
    times: dict[str, float] = {}
    wrong: dict[str, int] = {}
    for nbytes in (int(s) for s in args.sizes.split(",")):
        count = nbytes // 4
        wrong[str(nbytes)] = int(peer.max(float(wrong_elements(peer, count))))
        times[str(nbytes)] = time_size(peer, count, args.target, args.reps) * 1e6
    if peer.rank == 0:
        print("RESULT " + json.dumps({"name": peer.name, "us": times, "wrong": wrong}), flush=True)
    peer.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
