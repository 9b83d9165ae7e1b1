"""Many small tensors: one all_reduce per tensor against pycomm's bucketed (coalesced) all-reduce,
and against gloo's coalesced all-reduce, in the same ranks and run.

    python3 benchmarks/coalesced.py [--nproc 4] [--tensors 1000] [--transport tcp]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent.parent


def make_tensors(count: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(256, 16 * 1024 + 1, (count,), generator=g)  # 1 to 64 KiB of float32
    return [torch.ones(int(n)) for n in sizes]


def timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    import pycomm

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    pc = dist.new_group(backend="pycomm", pg_options=pycomm.Options(transport=args.transport))
    gl = dist.new_group(backend="gloo")
    tensors = make_tensors(args.tensors, 0)
    total = sum(t.numel() for t in tensors)

    def per_tensor(group: dist.ProcessGroup) -> None:
        for t in tensors:
            dist.all_reduce(t, group=group)

    results = {
        "pycomm per tensor": timed(lambda: per_tensor(pc), args.reps),
        "pycomm coalesced": timed(lambda: pycomm.bucketed_all_reduce(tensors, group=pc), args.reps),
        "gloo per tensor": timed(lambda: per_tensor(gl), args.reps),
        "gloo coalesced": timed(lambda: dist.all_reduce_coalesced(tensors, group=gl), args.reps),
    }
    # Correctness of the coalesced path on fresh data: every rank contributes rank + 1.
    check = [torch.full((t.numel(),), float(rank + 1)) for t in tensors]
    pycomm.bucketed_all_reduce(check, group=pc)
    wrong = sum(int((c != world * (world + 1) / 2).sum()) for c in check)
    if rank == 0:
        Path(out).write_text(json.dumps({"results": results, "bytes": total * 4, "wrong": wrong}))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--tensors", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--transport", default="tcp", choices=("auto", "tcp"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "coalesced.json"))
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = args.out + ".tmp"
    mp.start_processes(worker, args=(args.nproc, port, args, tmp), nprocs=args.nproc, start_method="spawn")
    data = json.loads(Path(tmp).read_text())
    os.remove(tmp)
    r = data["results"]
    print(f"{args.tensors} tensors of 1-64 KiB ({data['bytes'] / 2**20:.1f} MiB), world {args.nproc}, "
          f"pycomm transport {args.transport}; median of {args.reps}")
    for name, seconds in r.items():
        print(f"  {name:<20} {seconds * 1e3:9.2f} ms")
    print(f"  coalesced vs per tensor (pycomm): {r['pycomm per tensor'] / r['pycomm coalesced']:.1f}x")
    print(f"  pycomm coalesced vs gloo coalesced: {r['gloo coalesced'] / r['pycomm coalesced']:.2f}x")
    print(f"  wrong elements: {data['wrong']}")
    Path(args.out).write_text(json.dumps({"command": "python3 benchmarks/coalesced.py " + " ".join(sys.argv[1:]),
                                          "world": args.nproc, "transport": args.transport, **data}, indent=2) + "\n")
    return 1 if data["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
