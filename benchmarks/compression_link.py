"""Compressed all-reduce over a slow link: namespace "hosts" joined at a fixed rate.

For a 64 MiB float32 all_reduce it times pycomm uncompressed, pycomm with each codec, gloo, and a plain
"cast to fp16, then all_reduce" on pycomm, in the same run, and reports the ratios and busbw against
the link's line rate. With several ranks a host, pycomm's all-reduces (compressed ones too) are
hierarchical: shared memory inside a host, the link across. Needs root (network namespaces);
results go to benchmarks/results/.

    python3 benchmarks/compression_link.py [--hosts 2] [--nproc-per-node 1] [--rate 1gbit] [--mib 64] [--iters 5]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from netns import Testbed, available  # noqa: E402

CONFIGS = ["pycomm", "pycomm+fp16", "pycomm+bf16", "pycomm+fp8_e4m3", "pycomm+fp8_e5m2", "pycomm cast fp16", "gloo"]


def worker(rank: int, world: int, master: str, mib: int, iters: int) -> None:
    import torch
    import torch.distributed as dist

    import pycomm

    torch.set_num_threads(1)
    dist.init_process_group("pycomm", init_method=f"tcp://{master}:29650", rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    n = mib * 1024 * 1024 // 4
    torch.manual_seed(rank)
    data = torch.randn(n)
    results = {}
    for name in CONFIGS:
        times = []
        for it in range(iters + 1):
            if name == "pycomm cast fp16":
                t = data.to(torch.float16)
            else:
                t = data.clone()
            dist.barrier()
            start = time.perf_counter()
            if name == "gloo":
                dist.all_reduce(t, group=gloo)
            elif name.startswith("pycomm+"):
                pycomm.all_reduce(t, compression=name.split("+")[1])
            else:
                dist.all_reduce(t)
            elapsed = time.perf_counter() - start
            if it > 0:  # the first is warm-up
                times.append(elapsed)
        results[name] = statistics.median(times)
    if rank == 0:
        print(json.dumps(results), flush=True)
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--out", help="JSON file (default: benchmarks/results/compression_link-HxN-RATE.json)")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    args = parser.parse_args()
    world = args.hosts * args.nproc_per_node
    if args.worker is not None:
        worker(args.worker, world, args.master, args.mib, args.iters)
        return 0
    out = args.out or str(ROOT / "benchmarks" / "results" /
                          f"compression_link-{args.hosts}x{args.nproc_per_node}-{args.rate}.json")
    why = available()
    if why:
        print(f"compression_link: {why}", file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    with Testbed(hosts=args.hosts, rate=args.rate) as bed:
        procs = [
            bed.popen(r // args.nproc_per_node,
                      [sys.executable, __file__, "--worker", str(r), "--master", bed.address(0), "--mib", str(args.mib),
                       "--iters", str(args.iters), "--hosts", str(args.hosts),
                       "--nproc-per-node", str(args.nproc_per_node)],
                      env=dict(env, PYCOMM_SOCKET_IFNAME="eth0", GLOO_SOCKET_IFNAME="eth0"), stdout=subprocess.PIPE, text=True)
            for r in range(world)
        ]
        outputs = [p.communicate(timeout=900)[0] for p in procs]
        if any(p.returncode for p in procs):
            print("compression_link: a rank failed", file=sys.stderr)
            return 1
    times = json.loads(outputs[0].strip().splitlines()[-1])
    nbytes = args.mib * 1024 * 1024
    rate_bytes = {"gbit": 1e9 / 8, "mbit": 1e6 / 8}[args.rate[-4:]] * float(args.rate[:-4])
    base = times["pycomm"]
    rows = []
    # busbw = algbw * 2(p-1)/p; what crosses the link is that of the hosts' all-reduce: 2(h-1)/h.
    link_factor = 2 * (args.hosts - 1) / args.hosts
    print(f"{'config':<20}{'time (s)':>10}{'busbw (MB/s)':>14}{'vs line rate':>14}{'speed-up':>10}")
    for name in CONFIGS:
        busbw = nbytes / times[name] * link_factor
        row = {"config": name, "seconds": times[name], "busbw_MBps": busbw / 1e6,
               "fraction_of_line_rate": busbw / rate_bytes, "speedup_vs_uncompressed": base / times[name]}
        rows.append(row)
        print(f"{name:<20}{times[name]:>10.3f}{busbw / 1e6:>14.1f}{busbw / rate_bytes:>14.2f}{base / times[name]:>10.2f}")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({
        "command": "python3 benchmarks/compression_link.py " + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hosts": args.hosts, "nproc_per_node": args.nproc_per_node, "rate": args.rate, "mib": args.mib, "iters": args.iters, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
