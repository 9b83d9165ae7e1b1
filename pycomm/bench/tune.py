"""``python -m pycomm.bench --tune``: fit the cost model behind ``algorithm="auto"``.

Measures all_reduce with each algorithm (ring, tree, rhd) over TCP at this world size, fits alpha
(seconds per step) and beta (seconds per byte a rank moves) per algorithm by least squares (see
pycomm.tuning), prints predicted against measured times, and writes the table that new process
groups read.
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


def tune(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: Sequence[str]) -> int:
    from pycomm.bench.cli import _run, config_from_args

    args.backends = ["pycomm"]
    args.op = ["all_reduce"]
    args.algo = list(tuning.ALGORITHMS)
    args.compression = None
    args.transport = "tcp"  # auto only chooses among TCP schedules; shared memory has its own
    out = Path(args.tune_out) if args.tune_out else tuning.USER_TABLE
    with tempfile.TemporaryDirectory() as tmp:
        args.json = os.path.join(tmp, "tune.json")
        config = config_from_args(args, parser, argv)
        config = dataclasses.replace(config, json_path=args.json)
        status = _run(config, args.nproc or 2)
        if status != 0:
            return status
        document = json.loads(Path(args.json).read_text())
    world = int(document["meta"]["world_size"])
    points = [
        (row["algo"], int(row["size_bytes"]), world, float(row["time_us"]) * 1e-6)
        for row in document["rows"]
        if row.get("time_us") and row.get("algo") in tuning.ALGORITHMS
    ]
    model = tuning.fit(points)
    print(f"\nfitted at world {world}: seconds = alpha * steps(p) + beta * bytes_per_rank(n, p)")
    for name, (alpha, beta) in model.items():
        print(f"  {name:<5} alpha {alpha * 1e6:8.2f} us/step   beta {beta * 1e9:7.3f} ns/byte")
    print(f"\n{'size':>10} " + " ".join(f"{a + ' meas/pred (us)':>24}" for a in model))
    for size in sorted({n for _, n, _, _ in points}):
        cells = []
        for name, (alpha, beta) in model.items():
            measured = next((t for a, n, _, t in points if a == name and n == size), float("nan"))
            predicted = alpha * tuning.steps(name, world) + beta * tuning.bytes_moved(name, size, world)
            cells.append(f"{measured * 1e6:>11.1f}/{predicted * 1e6:<12.1f}")
        print(f"{size:>10} " + " ".join(f"{c:>24}" for c in cells))
    tuning.write_table(out, model, {
        "command": "python -m pycomm.bench " + " ".join(argv),
        "host": socket.gethostname(),
        "world_size": world,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "points": [{"algo": a, "size_bytes": n, "seconds": t} for a, n, _, t in points],
    })
    print(f"\nwrote {out}")
    return 0
