"""What a subgroup costs to create: 8 `dist.new_group` calls at world 4 (the default group's ranks and
halves of them, as a DeviceMesh makes), each followed by one all-reduce on it, per backend and
pycomm transport, median of `--rounds` rounds. `--base` measures another checkout's build too;
`--repeats N` runs every case N times, the cases alternating, and takes the median of all rounds.

    python3 benchmarks/subgroups.py [--base <checkout>] [--rounds 3] [--repeats 1] [--out benchmarks/results/subgroups]
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
import os, sys, time, torch, torch.distributed as dist
import pycomm
assert os.path.dirname(os.path.dirname(os.path.abspath(pycomm.__file__))) == os.getcwd(), pycomm.__file__
rank, backend, transport, rounds = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
dist.init_process_group(backend, rank=rank, world_size=4)
world = 4
def members(i):
    return list(range(world)) if i % 2 == 0 else [r for r in range(world) if r % 2 == (i // 2) % 2]
times = []
for _ in range(rounds):
    dist.barrier()
    start = time.perf_counter()
    opts = pycomm.Options(transport=transport) if backend == "pycomm" else None
    groups = [dist.new_group(members(i), backend=backend, pg_options=opts) for i in range(8)]
    for i, g in enumerate(groups):
        if rank in members(i):
            t = torch.ones(1)
            dist.all_reduce(t, group=g)
            assert t.item() == len(members(i))
    dist.barrier()
    times.append((time.perf_counter() - start) * 1e3)
if rank == 0:
    print("MS " + " ".join(f"{t:.1f}" for t in times))
dist.destroy_process_group()
"""


def run(checkout: Path, backend: str, transport: str, rounds: int, port: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    # In the checkout: `python -c` puts the working directory ahead of PYTHONPATH, so from anywhere
    # else every case would import the pycomm found there.
    procs = [subprocess.Popen([sys.executable, "-c", RANK_PROGRAM, str(r), backend, transport, str(rounds)],
                              env=env, cwd=checkout, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for r in range(4)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError(f"{backend}/{transport}: a rank failed")
    line = next(x for x in outs[0].splitlines() if x.startswith("MS "))
    return [float(v) for v in line.split()[1:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cases = [("this build", ROOT, "pycomm", "auto"), ("this build", ROOT, "pycomm", "tcp")]
    if args.base is not None:
        cases = [("base build", args.base.resolve(), "pycomm", "auto"), ("base build", args.base.resolve(), "pycomm", "tcp")] + cases
    cases.append(("gloo", ROOT, "gloo", "-"))
    port = 31000 + os.getpid() % 2000
    results: dict[str, list[float]] = {f"{name} {backend} {transport}": [] for name, _, backend, transport in cases}
    for _ in range(args.repeats):
        for name, checkout, backend, transport in cases:
            port += 1
            results[f"{name} {backend} {transport}"] += run(checkout, backend, transport, args.rounds, port)
    lines = [f"8 new_groups + one all_reduce each, world 4, ms (median of {args.repeats} x {args.rounds} rounds, "
             "the cases alternating)", "",
             "| case | ms | rounds |", "| --- | --- | --- |"]
    for key, ms in results.items():
        lines.append(f"| {key} | {statistics.median(ms):.0f} | {', '.join(f'{m:.0f}' for m in ms)} |")
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "table.md").write_text(table + "\n")
        (args.out / "runs.json").write_text(json.dumps({"rounds": results, "when": time.strftime("%Y-%m-%d")}, indent=2) + "\n")


if __name__ == "__main__":
    main()
