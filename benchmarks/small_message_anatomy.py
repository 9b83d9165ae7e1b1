"""Where the time of a small all-reduce goes, by layers measured in one run (float32 SUM, in place,
rank 0's wall time per call over a loop, median of `--repeats` loops):

    torch floor     dist.all_reduce on torch's `fake` backend, whose ops complete at once: torch's
                    Python wrapper, its dispatcher, the c10d op and a Work
    dist, world N   dist.all_reduce on pycomm
    dist, no FR     the same with the flight recorder off (TORCH_FR_BUFFER_SIZE=0)
    Work loop       PycommBackend::allreduce and Work::wait looped in C++ (_time_work_all_reduce):
                    pycomm's c10d entry, its op descriptor, Work and flight-recorder entry, the op
    direct op       torch.ops.pycomm.direct_all_reduce_ (no c10d, no Work): a torch op called from
                    Python, whose arguments torch parses against the schema
    direct wrapper  pycomm.direct_all_reduce, which dispatches the same op from C++
    C++ loop        the direct call looped in C++ (PycommBackend._time_direct_all_reduce): pycomm's
                    checks, the core's op and the exchange, with no torch dispatch at all

At world 1 the core sends nothing, so the C++ loop there is pycomm's own per-op cost, and world N
minus world 1 is the exchange (and the reduction). The differences between layers are the parts:
pycomm's Work path (Work loop - C++ loop), of which the flight recorder (dist - dist, no FR), the
dispatch of a torch op (direct op - C++ loop), and torch's Python wrapper, dispatcher and c10d op
(dist - Work loop, which the floor also pays). `--base CHECKOUT` adds that checkout's dist.all_reduce.

    python3 benchmarks/small_message_anatomy.py [--worlds 1,2,4] [--transport shm] [--bytes 4096]
        [--iters 20000] [--repeats 5] [--base CHECKOUT] [--perf OUT.txt]

`--perf` also samples rank 0 of the world-2 dist.all_reduce loop with `perf record` and writes the
symbols with the most samples, grouped by library, to OUT.txt.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RANK_PROGRAM = r"""
import os, sys, time, torch, torch.distributed as dist
layer, nbytes, iters, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if layer == "fake":
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
else:
    import pycomm
    dist.init_process_group("pycomm", pg_options=pycomm.Options(transport=os.environ["PYCOMM_ANATOMY_TRANSPORT"]))
t = torch.zeros(nbytes // 4)
if layer in ("fake", "dist", "dist-nofr"):
    call = lambda: dist.all_reduce(t)
elif layer == "direct":
    op, name = torch.ops.pycomm.direct_all_reduce_, dist.group.WORLD.group_name
    call = lambda: op(t, "sum", name)
elif layer == "wrapper":
    group = dist.group.WORLD
    call = lambda: pycomm.direct_all_reduce(t, dist.ReduceOp.SUM, group)
backend = None if layer == "fake" else dist.group.WORLD._get_backend(torch.device("cpu"))
samples = []
for _ in range(repeats + 1):
    if layer != "fake":
        dist.barrier()
    if layer == "cpp":
        samples.append(backend._time_direct_all_reduce(t, iters) / iters)
        continue
    if layer == "work":
        samples.append(backend._time_work_all_reduce(t, iters) / iters)
        continue
    start = time.perf_counter()
    for _ in range(iters):
        call()
    samples.append((time.perf_counter() - start) / iters)
if rank == 0:
    print("US " + " ".join(f"{s * 1e6:.3f}" for s in samples[1:]))
if layer != "fake":
    dist.destroy_process_group()
"""


def run(layer: str, world: int, transport: str, args: argparse.Namespace, port: int,
        perf: Path | None = None, checkout: Path = ROOT) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1", "PYCOMM_ANATOMY_TRANSPORT": transport}
    if layer == "dist-nofr":
        env["TORCH_FR_BUFFER_SIZE"] = "0"
    procs = []
    for r in range(1 if layer == "fake" else world):
        command = [sys.executable, "-c", RANK_PROGRAM, layer, str(args.bytes), str(args.iters), str(args.repeats)]
        if perf is not None and r == 0:
            command = ["perf", "record", "-q", "-F", "4999", "-o", str(perf), "--"] + command
        procs.append(subprocess.Popen(command, env={**env, "RANK": str(r)}, cwd=checkout, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    try:
        outs = [p.communicate(timeout=600) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise RuntimeError(f"{layer} at world {world}: no result within 600 s") from None
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError(f"{layer} at world {world} failed: {outs[0][1][-2000:]}")
    line = next(x for x in outs[0][0].splitlines() if x.startswith("US "))
    return [float(v) for v in line.split()[1:]]


def perf_report(data: Path, out: Path) -> None:
    report = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,sym", "-g", "none",
                             "--percent-limit", "0.3", "--stdio"], capture_output=True, text=True, check=True).stdout
    lines = [x for x in report.splitlines() if x.strip() and not x.startswith("#")]
    by_dso = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "dso", "-g", "none",
                             "--stdio"], capture_output=True, text=True, check=True).stdout
    dsos = [x for x in by_dso.splitlines() if x.strip() and not x.startswith("#")]
    out.write_text("samples by library:\n" + "\n".join(dsos) + "\n\nsymbols over 0.3%:\n" + "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="1,2,4")
    parser.add_argument("--transport", default="shm")
    parser.add_argument("--bytes", type=int, default=4096)
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--base", type=Path, help="another checkout (built in place): its dist.all_reduce too")
    parser.add_argument("--perf", type=Path)
    args = parser.parse_args()
    port = 33500 + os.getpid() % 1000
    worlds = [int(w) for w in args.worlds.split(",")]
    rows: list[tuple[str, list[float]]] = []
    port += 1
    rows.append(("torch floor (fake backend)", run("fake", 1, "auto", args, port)))
    for world in worlds:
        transport = "auto" if world == 1 else args.transport  # one rank has no peer to reach
        if args.base is not None:
            port += 1
            rows.append((f"dist.all_reduce before ({args.base.name}), world {world}",
                         run("dist", world, transport, args, port, checkout=args.base.resolve())))
        for layer, label in (("dist", "dist.all_reduce"), ("dist-nofr", "dist.all_reduce, no flight recorder"),
                             ("work", "Work loop"), ("direct", "direct op"),
                             ("wrapper", "pycomm.direct_all_reduce"), ("cpp", "C++ loop")):
            port += 1
            rows.append((f"{label}, world {world}", run(layer, world, transport, args, port)))
    print(f"{args.bytes} B float32 all_reduce, {args.transport}, us per call (rank 0; median of {args.repeats} "
          f"loops of {args.iters})\n")
    print("| layer | median | loops |")
    print("| --- | --- | --- |")
    for label, samples in rows:
        print(f"| {label} | {statistics.median(samples):.2f} | {', '.join(f'{s:.2f}' for s in samples)} |")
    if args.perf is not None:
        if shutil.which("perf") is None:
            print("no perf here: --perf skipped")
            return
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "perf.data"
            port += 1
            run("dist", 2, args.transport, args, port, perf=data)
            perf_report(data, args.perf)
        print(f"perf profile of rank 0 (dist.all_reduce, world 2): {args.perf}")


if __name__ == "__main__":
    main()
