"""Runs the benchmark and the trainer across "hosts" made of network namespaces, with torchrun.

Builds a testbed of --hosts namespaces (optionally rate-limited with --rate, e.g. 1gbit), starts
torchrun on every host with --nproc-per-node ranks and static rendezvous at host 0, runs
`python -m pycomm.bench` (pycomm against gloo) and then `python -m pycomm.train` for each hook (fp8
with --error-feedback), stores what rank 0 wrote under
benchmarks/results/multihost-<hosts>x<nproc>[-<rate>][-<model>]/, and tears the testbed down. The
summary gives each hook's tokens/s and its ratio to uncompressed (none), the exposed comm share,
socket bytes per step and rank, and the final losses. Needs root.

    python3 benchmarks/multihost.py --hosts 2 --nproc-per-node 1 --rate 1gbit
    python3 benchmarks/multihost.py --hosts 2 --nproc-per-node 2 --rate 1gbit --model large --steps 40 --no-bench
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from netns import Testbed, available  # noqa: E402


def torchrun_everywhere(bed: Testbed, nproc: int, port: int, program: list[str], timeout: int) -> int:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               PYCOMM_SOCKET_IFNAME="eth0", GLOO_SOCKET_IFNAME="eth0")
    procs = []
    for host in range(bed.hosts):
        # Static rendezvous at host 0: each torchrun is told its node rank.
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(bed.hosts),
                "--node-rank", str(host), "--nproc-per-node", str(nproc),
                "--master-addr", bed.address(0), "--master-port", str(port), *program]
        procs.append(bed.popen(host, argv, env=env))
    status = 0
    for proc in procs:
        try:
            status |= proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            status = 1
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2, choices=(2, 3, 4))
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--rate", default=None, help="per-host egress rate, e.g. 1gbit")
    parser.add_argument("--sizes", default="4K:64M")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--hooks", default="none,fp16,bf16,fp8")
    parser.add_argument("--model", default="small", help="pycomm.train --model preset (default small)")
    parser.add_argument("--no-bench", action="store_true", help="skip pycomm.bench, run only the trainer")
    parser.add_argument("--timeout", type=int, default=1200)
    args = parser.parse_args()
    why = available()
    if why:
        print(f"multihost: {why}", file=sys.stderr)
        return 2
    name = f"multihost-{args.hosts}x{args.nproc_per_node}" + (f"-{args.rate}" if args.rate else "")
    name += "" if args.model == "small" else f"-{args.model}"
    out = ROOT / "benchmarks" / "results" / name
    out.mkdir(parents=True, exist_ok=True)
    status = 0
    with Testbed(hosts=args.hosts, rate=args.rate) as bed:
        if not args.no_bench:
            bench = ["-m", "pycomm.bench", "--sizes", args.sizes, "--json", str(out / "bench.json"),
                     "--plot", str(out / "bench.png")]
            status |= torchrun_everywhere(bed, args.nproc_per_node, 29710, bench, args.timeout)
        for i, hook in enumerate(args.hooks.split(",")):
            train = ["-m", "pycomm.train", "--model", args.model, "--hook", hook, "--steps", str(args.steps),
                     "--json", str(out / f"train-{hook}.json")]
            if hook == "fp8":
                train.append("--error-feedback")
            status |= torchrun_everywhere(bed, args.nproc_per_node, 29720 + i, train, args.timeout)
    summary = {}
    for hook in args.hooks.split(","):
        path = out / f"train-{hook}.json"
        if path.exists():
            log = json.loads(path.read_text())
            wire = log.get("wire", {}).get("per_step_and_rank", {})
            summary[hook] = {"tokens_per_s": log.get("tokens_per_s"), "comm_share": log.get("comm_share"),
                             "exposed_comm_share": log.get("exposed_comm_share"),
                             "socket_bytes_sent_per_step_and_rank": wire.get("socket_sent"),
                             "final_train_loss": (log.get("train_loss") or [None])[-1],
                             "final_val_loss": (log.get("val_loss") or [{}])[-1].get("loss")}
    base = summary.get("none", {}).get("tokens_per_s")
    for entry in summary.values():
        entry["speedup_vs_none"] = entry["tokens_per_s"] / base if base and entry["tokens_per_s"] else None
    (out / "train-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return status


if __name__ == "__main__":
    sys.exit(main())
