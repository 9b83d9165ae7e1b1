"""What recording costs per op: the flight recorder (TORCH_FR_BUFFER_SIZE=2000 against 0) and the
profiler hooks with no profiler active (this checkout against another build, `--base`), measured
in one run, alternating, on a 1-element all_reduce: at world 1 by default, where the op is all
dispatch and bookkeeping and no peer's scheduling adds noise (`--world 2`: shared memory).

    python3 benchmarks/recording_overhead.py [--base <checkout with a built extension>] [--world 1] \
        [--ops 50000] [--rounds 7] [--out benchmarks/results/recording-overhead]

In each run the recorder is paused and resumed every 1000 ops (pycomm._C._flight_recorder_set_recording),
so its cost is a difference inside one process (the base build, with nothing to pause, gives the
method's own noise); the base build runs in processes of its own,
alternating with this build's. Medians over the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RANK_PROGRAM = """
import os, sys, time, statistics, torch, torch.distributed as dist
import pycomm
assert os.path.dirname(os.path.dirname(os.path.abspath(pycomm.__file__))) == os.getcwd(), pycomm.__file__
rank, ops, world = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("pycomm", rank=rank, world_size=world)
toggle = getattr(pycomm._C, "_flight_recorder_set_recording", None)
t = torch.ones(1)
for _ in range(500):
    dist.all_reduce(t)
block = 1000
per_state = {True: [], False: []}
for b in range(max(2, ops // block)):
    on = b % 4 in (0, 3)  # on, off, off, on, ...: drift and any even/odd pattern hit both alike
    if toggle is not None:
        toggle(on)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(block):
        dist.all_reduce(t)
    per_state[on].append((time.perf_counter() - start) / block * 1e6)
dist.barrier()
if rank == 0:
    print(f"US_ON {statistics.median(per_state[True]):.4f}")
    print(f"US_OFF {statistics.median(per_state[False]):.4f}")
    print(f"US_ALL {statistics.median(per_state[True] + per_state[False]):.4f}")
dist.destroy_process_group()
"""


def one_run(checkout: Path, env_extra: dict[str, str], ops: int, port: int, world: int) -> dict[str, float]:
    env = {**os.environ, **env_extra, "PYTHONPATH": str(checkout), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
    # In the checkout: `python -c` puts the working directory ahead of PYTHONPATH.
    procs = [subprocess.Popen([sys.executable, "-c", RANK_PROGRAM, str(r), str(ops), str(world)], env=env,
                              cwd=checkout, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for r in range(world)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for p in procs:
        if p.returncode != 0:
            raise RuntimeError(f"a rank exited with {p.returncode}")
    values = dict(line.split() for line in outs[0].splitlines() if line.startswith("US_"))
    return {k: float(v) for k, v in values.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="another checkout with a built extension (the profiler A/B)")
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--ops", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    # The recorder is paused and resumed block by block inside one process (the difference is
    # taken there); the base build, which has no hooks for shapes, runs in processes of its own,
    # alternating with this build's.
    cases: dict[str, Path] = {"this build": ROOT}
    if args.base is not None:
        cases = {"base build": args.base.resolve(), **cases}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
    port = 29000 + os.getpid() % 2000
    for r in range(args.rounds):
        for name, checkout in cases.items():
            port += 1
            runs[name].append(one_run(checkout, {"TORCH_FR_BUFFER_SIZE": "2000"}, args.ops, port, args.world))
        print(f"round {r + 1}: " + ", ".join(f"{n}: {v[-1]}" for n, v in runs.items()), flush=True)
    this = runs["this build"]
    on = statistics.median(x["US_ON"] for x in this)
    off = statistics.median(x["US_OFF"] for x in this)
    delta = statistics.median(x["US_ON"] - x["US_OFF"] for x in this)
    lines = [f"1-element all_reduce at world {args.world}, {args.ops} ops a run in blocks of 1000 (on, off, off, on, ...), median of "
             f"{args.rounds} runs", "", "| case | us per op |", "| --- | --- |",
             f"| this build, recorder on (2000 entries) | {on:.3f} |",
             f"| this build, recorder paused | {off:.3f} |",
             f"| recording, per op (on - paused, within each run) | {delta:+.3f} |"]
    if args.base is not None:
        base = statistics.median(x["US_ALL"] for x in runs["base build"])
        mine = statistics.median(x["US_OFF"] for x in this)
        floor = statistics.median(x["US_ON"] - x["US_OFF"] for x in runs["base build"])
        lines += [f"| base build: the same block pattern with nothing to pause (the method's noise) | {floor:+.3f} |",
                  f"| base build (no shape hooks, no recorder) | {base:.3f} |",
                  f"| this build paused - base build (the profiler hooks with no profiler) | {mine - base:+.3f} |"]
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "table.md").write_text(table + "\n")
        (args.out / "runs.json").write_text(json.dumps({"ops": args.ops, "world": args.world, "runs": runs,
                                                        "when": time.strftime("%Y-%m-%d")}, indent=2) + "\n")


if __name__ == "__main__":
    main()
