"""Launch-to-launch spread of a TCP all-reduce, and where a slow launch spends its time: pycomm's
`dist.all_reduce` and Open MPI's (mpi4py) alternating, one fresh process pair per launch, world 2
over loopback, float32 SUM in place. Per launch rank 0 reports the median of its loops and, over
all of them, the CPU time (user, system) and context switches (voluntary: the rank slept; not:
it was preempted) per op from getrusage, whole process. A launch that reads twice the time of
another with the same code shows where the difference is: in the rank's own work (user), in the
kernel (system), or in waiting (neither, and more voluntary switches).

    python3 benchmarks/tcp_launch_modes.py [--launches 4] [--bytes 1048576] [--ops 40 --loops 20]
                                           [--checkout DIR ...] [--out FILE]

`--checkout` (repeatable) adds pycomm from that checkout (its build in place) as another column;
Open MPI is skipped, and says so, when mpirun or mpi4py is missing (benchmarks/peers.py --install).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rank_main(kind: str, nbytes: int, ops: int, loops: int) -> None:
    """One rank: times `loops` loops of `ops` all-reduces; rank 0 prints one JSON line."""
    import numpy as np

    if kind == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank = comm.Get_rank()
        buf = np.ones(nbytes // 4, dtype=np.float32)
        call, barrier = (lambda: comm.Allreduce(MPI.IN_PLACE, buf)), comm.Barrier
        check = lambda: buf  # noqa: E731
    else:
        import pycomm
        import torch
        import torch.distributed as dist

        rank = int(os.environ["RANK"])
        dist.init_process_group("pycomm", pg_options=pycomm.Options(transport="tcp"))
        t = torch.ones(nbytes // 4)
        call, barrier = (lambda: dist.all_reduce(t)), dist.barrier
        check = t.numpy
    for _ in range(10):
        call()
    # 10 all-reduces of ones at world 2: every element is 2 ** 10 (exact in float32). The timed
    # loops then run on zeros, which stay finite.
    wrong = int(np.count_nonzero(check() != 2.0**10))
    check()[:] = 0
    times: list[float] = []
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(loops):
        barrier()
        start = time.perf_counter()
        for _ in range(ops):
            call()
        times.append((time.perf_counter() - start) / ops * 1e6)
    after = resource.getrusage(resource.RUSAGE_SELF)
    n = ops * loops
    if rank == 0:
        print("RESULT " + json.dumps({
            "us": statistics.median(times), "wrong": wrong,
            "user_us": (after.ru_utime - before.ru_utime) / n * 1e6,
            "sys_us": (after.ru_stime - before.ru_stime) / n * 1e6,
            "voluntary": (after.ru_nvcsw - before.ru_nvcsw) / n,
            "involuntary": (after.ru_nivcsw - before.ru_nivcsw) / n,
        }), flush=True)
    if kind != "mpi":
        dist.destroy_process_group()


def launch(kind: str, checkout: Path | None, args: argparse.Namespace, port: int) -> dict:
    me = [sys.executable, str(Path(__file__).resolve()), "--rank-of", kind, "--bytes", str(args.bytes),
          "--ops", str(args.ops), "--loops", str(args.loops)]
    if kind == "mpi":
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "--bind-to", "none",
               "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo", *me]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600).stdout
    else:
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                   PYTHONPATH=str(checkout))
        procs = [subprocess.Popen(me, env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, text=True)
                 for r in (1, 0)]
        outs = [p.communicate(timeout=600)[0] for p in procs]
        out = outs[1]
    line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{kind} ({checkout}): no result")
    result = json.loads(line[len("RESULT "):])
    if result["wrong"]:
        raise SystemExit(f"{kind} ({checkout}): {result['wrong']} wrong elements")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank-of", help=argparse.SUPPRESS)
    parser.add_argument("--launches", type=int, default=4)
    parser.add_argument("--bytes", type=int, default=1 << 20)
    parser.add_argument("--ops", type=int, default=40)
    parser.add_argument("--loops", type=int, default=20)
    parser.add_argument("--checkout", type=Path, action="append", default=[])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.rank_of:
        rank_main(args.rank_of, args.bytes, args.ops, args.loops)
        return
    columns: list[tuple[str, str, Path | None]] = [("pycomm", "pycomm", ROOT)]
    columns += [(f"pycomm ({c.name})", "pycomm", c.resolve()) for c in args.checkout]
    have_mpi = shutil.which("mpirun") is not None and subprocess.run(
        [sys.executable, "-c", "import mpi4py"], capture_output=True).returncode == 0
    if have_mpi:
        columns.append(("Open MPI", "mpi", None))
    else:
        print("Open MPI skipped: mpirun or mpi4py not installed (benchmarks/peers.py --install)")
    lines = [f"{args.bytes} B float32 all_reduce, world 2, TCP on loopback; per launch, rank 0: median us of "
             f"{args.loops} loops of {args.ops}, then user / system CPU us and voluntary / involuntary "
             "context switches per op", "", "| launch | " + " | ".join(c[0] for c in columns) + " |",
             "| --- |" + " --- |" * len(columns)]
    port = 34500 + os.getpid() % 1000
    for i in range(args.launches):
        cells = []
        for _, kind, checkout in columns[i % len(columns):] + columns[:i % len(columns)]:
            port += 1
            r = launch(kind, checkout, args, port)
            cells.append((kind, checkout, f"{r['us']:.0f} us ({r['user_us']:.0f} / {r['sys_us']:.0f}; "
                                          f"{r['voluntary']:.1f} / {r['involuntary']:.1f})"))
        order = {(k, c): cell for k, c, cell in cells}
        lines.append(f"| {i + 1} | " + " | ".join(order[(k, c)] for _, k, c in columns) + " |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
