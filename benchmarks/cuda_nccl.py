"""All-reduce of CUDA tensors at world 2 on one GPU: pycomm's NCCL route beside torch's NCCL backend.

    python benchmarks/cuda_nccl.py [--sizes 4K,...,256M] [--reps 3] [--routes ring,tree,bf16,fp8,nccl]

Both ranks use cuda:0. NCCL refuses two ranks on one GPU of one host, so each rank sets NCCL_HOSTID
to a value of its own and NCCL connects them over its socket transport on loopback; torch's NCCL
backend and pycomm's NCCL route (pycomm's schedules over NCCL point-to-point) both pay that link.
Routes: pycomm ring, pycomm tree, pycomm ring with bf16 and fp8_e4m3 compression (fp32 in, the codec
on the wire), and torch's NCCL backend. Each rep times a size-dependent number of synchronous calls
with a device synchronize before the clock stops; the median rep is reported as microseconds per
call and bus bandwidth (2(p-1)/p bytes of the fp32 tensor per byte, whatever the codec puts on the
wire). For pycomm's routes the table also gives the bytes this rank sent per call, from
pycomm.stats(), which counts what the schedule posted on the NCCL link: about 2(p-1)/p of the
tensor's elements at 4 bytes, 2 (bf16) or 1 and the block scales (fp8). Each route is checked once per size on
values every codec carries exactly (rank + 1, sum 3), on every rank. Needs a GPU; exits 0 with a
message where torch sees none.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from gpu_ranks import gpu_parser, parse_or_skip, run_ranks


WORLD = 2
ROUTES = {
    "ring": dict(algorithm="ring"),
    "tree": dict(algorithm="tree"),
    "bf16": dict(algorithm="ring", compression="bf16"),
    "fp8": dict(algorithm="ring", compression="fp8_e4m3"),
    "nccl": None,  # torch's own backend
}


def iterations(nbytes: int) -> int:
    """About 64 MiB of traffic per rep, at least 3 calls and at most 50."""
    return max(3, min(50, (64 << 20) // max(nbytes, 1)))


def sent_bytes(group: dist.ProcessGroup) -> float:
    import pycomm

    return sum(v["bytes_sent"] for k, v in pycomm.stats(group).items() if k.startswith("allreduce"))


def time_route(name: str, group: dist.ProcessGroup, nbytes: int, reps: int) -> tuple[float, bool, float]:
    count = nbytes // 4
    rank = dist.get_rank()
    t = torch.full((count,), float(rank + 1), device="cuda:0")
    dist.all_reduce(t, group=group)
    torch.cuda.synchronize()
    ok = bool((t == 3.0).all().item()) if count else True
    iters = iterations(nbytes)
    before = sent_bytes(group) if name != "nccl" else 0.0
    times = []
    for _ in range(reps):
        dist.barrier(group=group, device_ids=[0])
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t, group=group)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / iters)
    per_call = (sent_bytes(group) - before) / (reps * iters) if name != "nccl" else float("nan")
    return statistics.median(times), ok, per_call


def worker(rank: int, port: int, sizes: list[int], routes: list[str], reps: int, results: Any) -> None:
    os.environ["NCCL_HOSTID"] = f"pycomm-bench-rank-{rank}"
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_IB_DISABLE", "1")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import pycomm

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    groups = {}
    for name in routes:
        options = ROUTES[name]
        if options is None:
            groups[name] = dist.new_group(backend="nccl")
        else:
            groups[name] = dist.new_group(
                backend="pycomm", pg_options=pycomm.Options(cuda_transport="nccl", **options))
    rows = []
    for nbytes in sizes:
        for name in routes:  # alternating: every route at one size before the next size
            seconds, ok, sent = time_route(name, groups[name], nbytes, reps)
            wrong = torch.tensor([0 if ok else 1])
            dist.all_reduce(wrong)  # the default group (gloo): every rank's check counts
            ok = int(wrong.item()) == 0
            rows.append((nbytes, name, seconds, ok, sent))
            if rank == 0:
                print(f"  {name:>5} {nbytes:>11} B {seconds * 1e6:11.1f} us ok={ok}", flush=True)
    if rank == 0:
        results.put(rows)
    dist.destroy_process_group()


def main() -> int:
    parser = gpu_parser(__doc__, sizes="4K,64K,1M,16M,64M,256M", reps=3, port=29673)
    parser.add_argument("--routes", default=",".join(ROUTES))
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds before the ranks are stopped")
    parsed = parse_or_skip(parser, "cuda_nccl")
    if parsed is None:
        return 0
    args, sizes = parsed
    routes = args.routes.split(",")
    unknown = [r for r in routes if r not in ROUTES]
    if unknown:
        parser.error(f"unknown routes {unknown}; known: {list(ROUTES)}")
    rows, clean = run_ranks(worker, WORLD, (args.port, sizes, routes, args.reps), args.deadline)
    if rows is None:
        print(f"cuda_nccl: the ranks failed or took longer than {args.deadline:.0f} s; nothing measured")
        return 1
    print(f"# all_reduce float32, world {WORLD} on one GPU ({torch.cuda.get_device_name(0)}), NCCL over "
          f"loopback sockets, median of {args.reps} reps")
    print(f"{'bytes':>11} {'route':>6} {'us/call':>11} {'busbw GB/s':>11} {'sent B/call':>12} {'vs nccl':>8} "
          f"{'correct':>8}")
    factor = 2 * (WORLD - 1) / WORLD
    nccl = {nbytes: seconds for nbytes, name, seconds, _, _ in rows if name == "nccl"}
    failed = False
    for nbytes, name, seconds, ok, sent in rows:
        failed |= not ok
        ratio = f"{nccl[nbytes] / seconds:.2f}" if nbytes in nccl else "-"
        sent_text = "-" if sent != sent else f"{sent:.0f}"  # NaN: torch's NCCL, which pycomm does not count
        print(f"{nbytes:>11} {name:>6} {seconds * 1e6:>11.1f} {factor * nbytes / seconds / 1e9:>11.3f} "
              f"{sent_text:>12} {ratio:>8} {'yes' if ok else 'NO':>8}")
    return 1 if failed or not clean else 0


if __name__ == "__main__":
    sys.exit(main())
