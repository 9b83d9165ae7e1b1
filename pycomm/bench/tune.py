"""``python -m pycomm.bench --tune``: fit the cost model behind ``algorithm="auto"``.

Measures all_reduce with each algorithm (ring, tree, rhd) over TCP at this world size, fits alpha
(seconds per step) and beta (seconds per byte a rank moves) per algorithm for each band between two
measured sizes (see pycomm.tuning), prints the measurements with the algorithm auto will pick, and
writes the table that new process groups read.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import socket
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pycomm import tuning
from pycomm.bench.config import BenchConfig
from pycomm.bench.launch import run


def prepare_args(args: argparse.Namespace) -> None:
    """Fix the flags a tuning run measures with, before the command line becomes a BenchConfig."""
    args.backends = ["pycomm"]
    args.op = ["all_reduce"]
    args.algo = list(tuning.ALGORITHMS)
    args.compression = None
    args.transport = "tcp"  # auto only chooses among TCP schedules; shared memory has its own
    args.json = None  # the measurements go to a file of the run's own (tune below)


def tune(config: BenchConfig, nproc: int, out_path: str | None, argv: Sequence[str]) -> int:
    """Measure with ``config`` (from prepare_args' flags), fit the bands and write the table."""
    out = Path(out_path) if out_path else tuning.USER_TABLE
    with tempfile.TemporaryDirectory() as tmp:
        measured = os.path.join(tmp, "tune.json")
        status = run(dataclasses.replace(config, json_path=measured), nproc)
        if status != 0:
            return status
        document = json.loads(Path(measured).read_text())
    world = int(document["meta"]["world_size"])
    points = [
        (row["algo"], int(row["size_bytes"]), world, float(row["time_us"]) * 1e-6)
        for row in document["rows"]
        if row.get("time_us") and row.get("algo") in tuning.ALGORITHMS
    ]
    overall = tuning.fit(points)
    bands = tuning.fit_bands(points)
    print(f"\nfitted at world {world}: seconds = alpha * steps(p) + beta * bytes_per_rank(n, p), per band")
    for limit, model in bands:
        print(f"  up to {'any size' if limit < 0 else f'{limit} B'}:")
        for name, (alpha, beta) in model.items():
            print(f"    {name:<5} alpha {alpha * 1e6:8.2f} us/step   beta {beta * 1e9:7.3f} ns/byte")
    names = [a for a in tuning.ALGORITHMS if any(a == p[0] for p in points)]
    print(f"\n{'size':>10} " + " ".join(f"{a + ' (us)':>12}" for a in names) + "   auto picks")
    for size in sorted({n for _, n, _, _ in points}):
        cells = [next((t for a, n, _, t in points if a == name and n == size), float("nan")) for name in names]
        print(f"{size:>10} " + " ".join(f"{c * 1e6:>12.1f}" for c in cells) + f"   {tuning.choose(bands, size, world)}")
    tuning.write_table(out, bands, overall, {
        "command": "python -m pycomm.bench " + " ".join(argv),
        "host": socket.gethostname(),
        "world_size": world,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "points": [{"algo": a, "size_bytes": n, "seconds": t} for a, n, _, t in points],
    })
    print(f"\nwrote {out}")
    return 0
