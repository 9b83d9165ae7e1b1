"""Convergence of each compression hook against fp32: the same training run seven times.

Trains ``python -m pycomm.train --model large`` for a fixed number of steps with --hook none (fp32),
fp16, bf16 and fp8 (e4m3), each compressing hook with and without --error-feedback: same seed, same
batches, same world size (local ranks on one host). Writes one JSON document with every run's loss
curves and a table of the final train and validation losses and their ratio to fp32's, and a plot
of the curves with that table. At the defaults (150 steps, world 2) it takes 10-15 minutes on a
2-core machine: ~14 s to start each run, then 0.25-1 s a step (on one host fp32's all-reduce is a
shared-memory copy, so compression saves little and its codec work shows; error feedback is slowest):

    python3 benchmarks/convergence.py            # -> benchmarks/results/convergence.{json,png}
    python3 benchmarks/convergence.py --steps 3 --runs none,fp8+ef --out /tmp/c   # a smoke test

"Final train loss" is the mean over the last tenth of the steps (one step's loss at a batch of a
few sequences is noisy); "final val loss" is the loss on the fixed validation windows after the
last step, the same windows for every run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
# (label, hook, error feedback); fp32 first: the others are compared with it.
RUNS = (
    ("none", "none", False),
    ("fp16", "fp16", False),
    ("fp16+ef", "fp16", True),
    ("bf16", "bf16", False),
    ("bf16+ef", "bf16", True),
    ("fp8", "fp8", False),
    ("fp8+ef", "fp8", True),
)
SCHEMA = "pycomm.convergence/1"


def final_train_loss(losses: list[float]) -> float:
    tail = losses[-max(1, len(losses) // 10) :]
    return sum(tail) / len(tail)


def train(args: argparse.Namespace, hook: str, ef: bool, log: Path) -> dict[str, Any]:
    argv = [sys.executable, "-m", "pycomm.train", "--model", args.model, "--hook", hook,
            "--steps", str(args.steps), "--seed", str(args.seed), "--nproc", str(args.nproc),
            "--eval-every", str(args.eval_every), "--json", str(log)]
    if ef:
        argv.append("--error-feedback")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[1:])} exited {proc.returncode}:\n{proc.stderr.strip()}")
    doc: dict[str, Any] = json.loads(log.read_text())
    doc["_wall_s"] = time.perf_counter() - started
    return doc


def row(label: str, doc: dict[str, Any], reference: dict[str, Any] | None) -> dict[str, Any]:
    train_final = final_train_loss(doc["train_loss"])
    val_final = doc["val_loss"][-1]["loss"]
    out = {
        "run": label,
        "hook": doc["config"]["hook"],
        "error_feedback": doc["config"]["error_feedback"],
        "hook_impl": doc["config"]["hook_impl"],
        "final_train_loss": train_final,
        "final_val_loss": val_final,
        "tokens_per_s": doc["tokens_per_s"],
        "exposed_comm_share": doc["exposed_comm_share"],
        "payload_bytes_per_step_and_rank": doc["wire"]["per_step_and_rank"]["payload_sent"],
        "wall_s": doc["_wall_s"],
    }
    if reference is not None:
        out["train_ratio_to_fp32"] = train_final / final_train_loss(reference["train_loss"])
        out["val_ratio_to_fp32"] = val_final / reference["val_loss"][-1]["loss"]
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| run | final train loss | ratio to fp32 | final val loss | ratio to fp32 | tokens/s |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['final_train_loss']:.4f} | {r.get('train_ratio_to_fp32', 1.0):.4f} | "
                     f"{r['final_val_loss']:.4f} | {r.get('val_ratio_to_fp32', 1.0):.4f} | {r['tokens_per_s']:,.0f} |")
    return "\n".join(lines)


def smooth(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot(path: Path, runs: dict[str, dict[str, Any]], rows: list[dict[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curves, cells) = plt.subplots(2, 1, figsize=(8, 8), dpi=100, height_ratios=(3, 1.4))
    try:
        window = max(1, len(next(iter(runs.values()))["train_loss"]) // 20)
        for i, (label, doc) in enumerate(runs.items()):
            color = f"C{i}"
            losses = doc["train_loss"]
            curves.plot(range(1, len(losses) + 1), smooth(losses, window), color=color, lw=1.2,
                        label=f"{label} train ({window}-step mean)")
            val_steps = [v["step"] for v in doc["val_loss"]]
            curves.plot(val_steps, [v["loss"] for v in doc["val_loss"]], "o--", color=color, ms=3, lw=0.8)
        curves.set_xlabel("step")
        curves.set_ylabel("loss (nats per byte); dashed: validation")
        curves.set_title(title, fontsize=10)
        curves.grid(alpha=0.3)
        curves.legend(fontsize=8, ncol=2)
        cells.axis("off")
        cells.table(
            cellText=[[r["run"], f"{r['final_train_loss']:.4f}", f"{r.get('train_ratio_to_fp32', 1.0):.4f}",
                       f"{r['final_val_loss']:.4f}", f"{r.get('val_ratio_to_fp32', 1.0):.4f}"] for r in rows],
            colLabels=["run", "final train", "/ fp32", "final val", "/ fp32"],
            loc="center",
        )
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="optimizer steps per run (default 150)")
    parser.add_argument("--model", default="large", help="pycomm.train --model preset (default large)")
    parser.add_argument("--nproc", type=int, default=2, help="local ranks (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=25, help="validate every N steps (default 25)")
    parser.add_argument("--runs", default=",".join(label for label, _, _ in RUNS),
                        help="comma list of runs to make, from " + ", ".join(label for label, _, _ in RUNS))
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for convergence.json and .png")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per run (default 1800)")
    args = parser.parse_args()
    known = {label: (hook, ef) for label, hook, ef in RUNS}
    chosen = [label.strip() for label in args.runs.split(",") if label.strip()]
    unknown = [label for label in chosen if label not in known]
    if unknown or not chosen:
        parser.error(f"unknown runs {unknown}; known: {', '.join(known)}")
    chosen = [label for label, _, _ in RUNS if label in chosen]  # fp32 first when asked for
    args.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="convergence-") as tmp:
        for label in chosen:
            hook, ef = known[label]
            print(f"convergence: {label}: {args.steps} steps ...", flush=True)
            runs[label] = train(args, hook, ef, Path(tmp) / f"{label}.json")
    reference = runs.get("none")
    rows = [row(label, doc, reference) for label, doc in runs.items()]
    first = next(iter(runs.values()))["config"]
    command = "python3 benchmarks/convergence.py " + " ".join(sys.argv[1:])
    document = {
        "schema": SCHEMA,
        "command": command.strip(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": args.model,
        "parameters": first["parameters"],
        "steps": args.steps,
        "world_size": first["world_size"],
        "batch_size": first["batch_size"],
        "seed": args.seed,
        "final_train_loss_is": "mean of the last tenth of the steps' train losses (mean over ranks)",
        "rows": rows,
        "runs": {label: {"train_loss": doc["train_loss"], "val_loss": doc["val_loss"], "config": doc["config"]}
                 for label, doc in runs.items()},
    }
    (args.out / "convergence.json").write_text(json.dumps(document, indent=2) + "\n")
    print(table(rows), flush=True)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("convergence: matplotlib missing, no plot", file=sys.stderr)
    else:
        plot(args.out / "convergence.png", runs, rows,
             f"model {args.model} ({first['parameters']:,} parameters), world {first['world_size']}, "
             f"{args.steps} steps, seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
