"""Layers of a small all-reduce alternating in one set of ranks (float32 SUM, in place; rank 0's wall
time per call over a loop, median of the rounds). small_message_anatomy.py launches each layer in
processes of its own, and on a shared machine a process pair keeps its speed for its whole life, so
two launches of the same code can differ by 2x; here every layer runs in the same processes, one
loop each per round, so what differs between layers is the layers.

    cpp        the direct op looped in C++ (PycommBackend._time_direct_all_reduce)
    cpp-once   the same, called from Python once per op: what returning to Python between ops costs
    wrapper    pycomm.direct_all_reduce
    busy       pycomm.direct_all_reduce after a busy loop of --busy-us in Python: what that much CPU
               per op costs at this world size (two ranks share a core at world 4 on two cores)
    dist       dist.all_reduce

`--world 1` gives each layer's own cost (no exchange): against it, the world-N rows say what the
exchange and the sharing of cores add to each.

    python3 benchmarks/small_message_alternating.py [--world 2] [--transport tcp] [--bytes 4096]
        [--iters 3000] [--rounds 5] [--busy-us 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("cpp", "cpp-once", "wrapper", "busy", "dist")

RANK_PROGRAM = r"""
import json, os, sys, time, torch, torch.distributed as dist
import pycomm
nbytes, iters, rounds, busy_us = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
layers = sys.argv[5].split(",")
dist.init_process_group("pycomm", pg_options=pycomm.Options(transport=os.environ["PYCOMM_ALT_TRANSPORT"]))
t = torch.zeros(nbytes // 4)
group = dist.group.WORLD
backend = group._get_backend(torch.device("cpu"))
SUM = dist.ReduceOp.SUM

def busy_then_wrapper():
    end = time.perf_counter() + busy_us * 1e-6
    while time.perf_counter() < end:
        pass
    pycomm.direct_all_reduce(t, SUM, group)

calls = {
    "cpp-once": lambda: backend._time_direct_all_reduce(t, 1),
    "wrapper": lambda: pycomm.direct_all_reduce(t, SUM, group),
    "busy": busy_then_wrapper,
    "dist": lambda: dist.all_reduce(t),
}
samples = {layer: [] for layer in layers}
for _ in range(rounds + 1):  # the first round warms up and is dropped
    for layer in layers:
        dist.barrier()
        if layer == "cpp":
            seconds = backend._time_direct_all_reduce(t, iters)
        else:
            call = calls[layer]
            start = time.perf_counter()
            for _ in range(iters):
                call()
            seconds = time.perf_counter() - start
        samples[layer].append(seconds / iters * 1e6)
if int(os.environ["RANK"]) == 0:
    print("US " + json.dumps({layer: values[1:] for layer, values in samples.items()}))
dist.destroy_process_group()
"""


def run(args: argparse.Namespace) -> dict[str, list[float]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(34500 + os.getpid() % 1000), "WORLD_SIZE": str(args.world), "OMP_NUM_THREADS": "1",
           "PYCOMM_ALT_TRANSPORT": "auto" if args.world == 1 else args.transport}
    command = [sys.executable, "-c", RANK_PROGRAM, str(args.bytes), str(args.iters), str(args.rounds),
               str(args.busy_us), ",".join(LAYERS)]
    procs = [subprocess.Popen(command, env={**env, "RANK": str(r)}, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(args.world)]
    try:
        outs = [p.communicate(timeout=900) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise RuntimeError("no result within 900 s") from None
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError(f"a rank failed: {outs[0][1][-2000:]}")
    line = next(x for x in outs[0][0].splitlines() if x.startswith("US "))
    return json.loads(line[3:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--transport", default="tcp")
    parser.add_argument("--bytes", type=int, default=4096)
    parser.add_argument("--iters", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--busy-us", type=float, default=8.0)
    args = parser.parse_args()
    samples = run(args)
    transport = "one rank" if args.world == 1 else args.transport
    print(f"{args.bytes} B float32 all_reduce, world {args.world}, {transport}: us per call (rank 0; median of "
          f"{args.rounds} rounds of {args.iters}, the layers alternating; busy = {args.busy_us:g} us)\n")
    print("| layer | median | rounds |")
    print("| --- | --- | --- |")
    for layer in LAYERS:
        values = samples[layer]
        print(f"| {layer} | {statistics.median(values):.2f} | {', '.join(f'{v:.2f}' for v in values)} |")


if __name__ == "__main__":
    main()
