"""Two builds of pycomm measured against each other in one session, alternating, so that machine
noise hits both alike: the default benchmark (all_reduce at world 2 over the default transport), the
TCP ring at world 2 and the world-4 algorithm sweep over TCP. Each configuration runs A, B, A, B, ...
(`--rounds` times each); the table gives, per size, the median time of A, of B and their ratio.

    python3 benchmarks/before_after.py --a <checkout A> --b <checkout B> --rounds 3 \
        --out benchmarks/results/before-after-NAME

Each checkout must hold a built extension (pycomm/_C*.so, `python3 setup.py build_ext --inplace`).
Only pycomm is measured (gloo is the same in both); every run checks its results (--check).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CONFIGS: dict[str, list[str]] = {
    "default-w2": ["--backends", "pycomm", "--sizes", "4K:64M", "--factor", "4"],
    "tcp-ring-w2": ["--backends", "pycomm", "--transport", "tcp", "--algo", "ring", "--sizes", "4K:64M", "--factor", "4"],
    "tcp-algos-w4": ["--backends", "pycomm", "--nproc", "4", "--transport", "tcp", "--algo", "ring,tree,rhd,auto",
                     "--sizes", "4K:16M", "--factor", "4"],
}


def run_once(checkout: Path, args: list[str], out: Path) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    # Run in the results folder, so the command the JSON records names the file alone.
    cmd = [sys.executable, "-m", "pycomm.bench", *args, "--json", out.name]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, cwd=out.parent)
    rows = json.loads(out.read_text())["rows"]
    bad = [r for r in rows if r.get("error") or r.get("wrong")]
    if bad:
        raise SystemExit(f"{checkout}: wrong results or errors in {out}: {bad[:2]}")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", type=Path, required=True, help="checkout A (before)")
    parser.add_argument("--b", type=Path, required=True, help="checkout B (after)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=",".join(CONFIGS), help="comma list of configurations")
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON files and the table")
    args = parser.parse_args()
    unknown = sorted(set(args.only.split(",")) - set(CONFIGS))
    if unknown:
        parser.error(f"unknown configurations {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    times: dict[tuple[str, str, str, int], list[float]] = {}
    for name in args.only.split(","):
        for round_ in range(args.rounds):
            for side, checkout in (("a", args.a), ("b", args.b)):
                rows = run_once(checkout.resolve(), CONFIGS[name], args.out / f"{name}-{side}{round_}.json")
                for r in rows:
                    times.setdefault((name, r["label"], side, r["size_bytes"]), []).append(r["time_us"])
    lines = [f"# before/after, medians of {args.rounds} alternating runs each (time_us = median over reps of the "
             "slowest rank); ratio = B / A (below 1: B faster)",
             f"{'config':<14} {'variant':<14} {'size':>10} {'A us':>10} {'B us':>10} {'B/A':>6}"]
    summary = []
    for (name, label, side, size), _ in sorted(times.items()):
        if side != "a":
            continue
        a = statistics.median(times[(name, label, "a", size)])
        b = statistics.median(times[(name, label, "b", size)])
        lines.append(f"{name:<14} {label:<14} {size:>10} {a:>10.1f} {b:>10.1f} {b / a:>6.2f}")
        summary.append({"config": name, "variant": label, "size_bytes": size, "a_us": a, "b_us": b, "ratio": b / a})
    table = "\n".join(lines)
    print(table)
    (args.out / "table.txt").write_text(table + "\n")
    (args.out / "summary.json").write_text(json.dumps({"a": args.a.resolve().name, "b": args.b.resolve().name, "rounds": args.rounds,
                                                       "rows": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
