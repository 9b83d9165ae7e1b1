"""pycomm's all-reduce against the peers a CPU user would pick instead, in one run: gloo (through
torch), Open MPI (mpi4py, raw numpy buffers) and DeepSpeed's CPU shared-memory all-reduce
(`deepspeed.comm.inference_all_reduce`), float32 SUM in place, the same sizes and world for all.

Each configuration (world size and transport) runs `--rounds` rounds; a round launches every peer
once, in an order that rotates from round to round, so the peers alternate and a slow spell of the
machine hits them alike. A peer's time at a size is the median of its rounds (each round's time is
itself a median of loops: benchmarks/peer_ranks.py). Every peer's result is checked against a
float64 reference at every size; a wrong element fails the run.

Peers that are not installed are skipped, and the output says so; `--install` installs them first
(Open MPI with apt-get, mpi4py and DeepSpeed with pip). `--base CHECKOUT` adds that checkout's pycomm
(its build in place), for a before/after in the same run.

`--probe` runs benchmarks/host_probe.c (two processes exchanging 32 KiB through shared memory, no
library) before and after every launch. This host's speed at moving data between its cores changes
by 3-4x from one minute to the next, and every peer's small messages move with it; the probe tells
the modes apart, and the report adds a table by mode of the launches whose probes agree.

    python3 benchmarks/peers.py [--install] [--base CHECKOUT] [--configs shm2,shm4,tcp2] [--rounds 3]
                                [--sizes 4K,64K,1M,64M] [--probe] [--out benchmarks/results/peers]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pycomm.bench.sizes import format_size, parse_size

ROOT = Path(__file__).resolve().parent.parent
RANKS = Path(__file__).resolve().parent / "peer_ranks.py"
PROBE = Path(__file__).resolve().parent / "host_probe.c"
# The run's probes split in two modes (the split of their logarithms with the least spread within
# each side) when the sides' geometric means are this far apart; otherwise the host had one mode.
MODES_APART = 1.8
CONFIGS = {
    # name: (world, pycomm transport, Open MPI's transport components)
    "shm2": (2, "shm", "self,vader"),
    "shm4": (4, "shm", "self,vader"),
    "tcp2": (2, "tcp", "self,tcp"),
    "tcp4": (4, "tcp", "self,tcp"),
}


@dataclass(frozen=True)
class Case:
    """One column of a configuration's table: a peer, from a checkout."""

    label: str
    peer: str
    checkout: Path

    def applies(self, transport: str) -> bool:
        return not (self.peer == "deepspeed" and transport != "shm")


def install_peers() -> None:
    if shutil.which("mpirun") is None:
        subprocess.run(["apt-get", "install", "-y", "openmpi-bin", "libopenmpi-dev"], check=True)
    missing = [p for p in ("mpi4py", "deepspeed") if importlib.util.find_spec(p) is None]
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", *missing], check=True)


def available(peer: str) -> str | None:
    """None if the peer can run here, else why not."""
    if peer == "mpi":
        if shutil.which("mpirun") is None or importlib.util.find_spec("mpi4py") is None:
            return "Open MPI or mpi4py not installed (--install: apt-get install openmpi-bin libopenmpi-dev; pip install mpi4py)"
    if peer == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        return "DeepSpeed not installed (--install: pip install deepspeed)"
    return None


def collect(case: Case, procs: list[subprocess.Popen], timeout: float) -> list[tuple[str, str]]:
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError(f"{case.label}: no result within {timeout} s")
    return outs


def launch(case: Case, world: int, transport: str, mpi_btl: str, sizes: str, args: argparse.Namespace,
           port: int) -> dict:
    common = ["--peer", case.peer, "--transport", transport, "--sizes", sizes, "--target", str(args.target),
              "--reps", str(args.reps)]
    env = {**os.environ, "PYTHONPATH": str(case.checkout), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
           "DS_ACCELERATOR": "cpu", "LOCAL_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "WORLD_SIZE": str(world)}
    if case.peer == "mpi":
        # Unbound, like the torch peers' ranks; --oversubscribe for more ranks than cores.
        command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(world),
                   "--mca", "pml", "ob1", "--mca", "btl", mpi_btl, "--mca", "btl_tcp_if_include", "lo",
                   sys.executable, str(RANKS), *common]
        procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    else:
        procs = [subprocess.Popen([sys.executable, str(RANKS), *common],
                                  env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(world)]
    try:
        outs = collect(case, procs, args.launch_timeout)
    finally:
        if case.peer == "deepspeed":
            # DeepSpeed leaves its buffers in /dev/shm, named by address and port; a later launch on
            # the same port would find them and wait for ranks that are gone.
            for leftover in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_127.0.0.1_{port}_*"):
                leftover.unlink(missing_ok=True)
    if any(p.returncode != 0 for p in procs):
        tail = "\n".join(err.strip().splitlines()[-1] if err.strip() else "" for _, err in outs)
        raise RuntimeError(f"{case.label} at world {world} ({transport}) failed:\n{tail}")
    line = next(x for out, _ in outs for x in out.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


class HostProbe:
    """benchmarks/host_probe.c, compiled once per run: the host's cross-core copy time, in us."""

    def __init__(self, workdir: Path) -> None:
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise SystemExit("--probe needs a C compiler (cc or gcc)")
        self.binary = workdir / "host_probe"
        subprocess.run([compiler, "-O2", "-o", str(self.binary), str(PROBE)], check=True)

    def __call__(self) -> float:
        out = subprocess.run([str(self.binary), "65536", "1000", "3"], check=True, capture_output=True, text=True,
                             timeout=120)
        return float(out.stdout)


def split_modes(probes: list[float]) -> float | None:
    """The largest probe of the fast mode, or None if the sorted ``probes`` show one mode."""
    logs = [math.log(p) for p in probes]
    best: tuple[float, int] | None = None
    for i in range(1, len(logs)):
        lo, hi = logs[:i], logs[i:]
        spread = sum((x - statistics.fmean(lo)) ** 2 for x in lo) + sum((x - statistics.fmean(hi)) ** 2 for x in hi)
        if best is None or spread < best[0]:
            best = (spread, i)
    if best is None:
        return None
    i = best[1]
    apart = math.exp(statistics.fmean(logs[i:]) - statistics.fmean(logs[:i]))
    return probes[i - 1] if apart >= MODES_APART else None


def by_mode(config: str, cases: list[Case], sizes: list[int], results: dict[str, list[dict]]) -> str:
    """The launches split by the host's mode (their probes), with each peer's medians per mode."""
    probes = sorted(p for runs in results.values() for r in runs for p in r.get("probe_us", ()))
    if not probes:
        return ""
    bound = split_modes(probes)
    if bound is None:
        modes = {"one mode": lambda p: True}
        heading = f"probes {probes[0]:.1f}-{probes[-1]:.1f} us: one mode"
    else:
        modes = {"fast": lambda p: max(p) <= bound, "slow": lambda p: min(p) > bound}
        heading = f"fast: both probes <= {bound:.1f} us, slow: both above; a launch across a change is left out"
    ran = [c for c in cases if results[c.label]]
    first = ran[0].label
    lines = [f"#### {config} by the host's mode ({heading})\n",
             row(["mode", "size", *(f"{c.label} (us, launches)" for c in ran), *(f"{c.label} / {first}" for c in ran[1:])]),
             "| --- " * (2 + 2 * len(ran) - 1) + "|"]
    for mode, holds in modes.items():
        kept = {c.label: [r for r in results[c.label] if holds(r["probe_us"])] for c in ran}
        if not all(kept.values()):
            lines.append(row([mode, "", *(f"- ({len(kept[c.label])})" for c in ran), *([""] * (len(ran) - 1))]))
            continue
        for n in sizes:
            med = {c.label: statistics.median(r["us"][str(n)] for r in kept[c.label]) for c in ran}
            lines.append(row([mode, format_size(n), *(f"{med[c.label]:.1f} ({len(kept[c.label])})" for c in ran),
                              *(f"{med[c.label] / med[first]:.2f}" for c in ran[1:])]))
    return "\n".join(lines) + "\n"


def row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def table(config: str, world: int, transport: str, cases: list[Case], sizes: list[int],
          results: dict[str, list[dict]], medians: dict[str, dict[str, float]]) -> str:
    ran = [c for c in cases if c.label in medians]
    head = f"### {config}: world {world}, {'shared memory' if transport == 'shm' else 'TCP (loopback)'}\n\n"
    if not ran:
        return head + "no peer gave a result\n"
    first = ran[0].label
    lines = [row(["size", *(f"{c.label} (us)" for c in ran), *(f"{c.label} / {first}" for c in ran[1:])])]
    lines.append("| --- " * (1 + 2 * len(ran) - 1) + "|")
    for n in sizes:
        med = {c.label: medians[c.label][str(n)] for c in ran}
        lines.append(row([format_size(n), *(f"{med[c.label]:.1f}" for c in ran),
                          *(f"{med[c.label] / med[first]:.2f}" for c in ran[1:])]))
    names = "\n".join(f"- {c.label}: {results[c.label][0]['name']}" for c in ran)
    return head + "\n".join(lines) + "\n\n" + names + "\n"


def plot(path: Path, sizes: list[int], summary: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no plot")
        return
    configs = list(summary)
    fig, axes = plt.subplots(1, len(configs), figsize=(5 * len(configs), 4), squeeze=False)
    for ax, config in zip(axes[0], configs):
        medians = summary[config]["median_us"]
        if not medians:
            continue
        first = next(iter(medians))
        for label, per_size in medians.items():
            ax.plot(sizes, [per_size[str(n)] / medians[first][str(n)] for n in sizes], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{config}: time / {first}")
        ax.set_xlabel("bytes")
        ax.axhline(1.0, color="gray", lw=0.5)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--install", action="store_true", help="install missing peers (apt-get, pip)")
    parser.add_argument("--base", type=Path, help="another checkout whose pycomm (built in place) runs too")
    parser.add_argument("--configs", default="shm2,shm4,tcp2")
    parser.add_argument("--peers", default="pycomm,pycomm-direct,mpi,deepspeed,gloo")
    parser.add_argument("--sizes", default="4K,16K,64K,256K,1M,4M,16M,64M")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.2, help="timed seconds per size, peer and round")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--launch-timeout", type=float, default=300)
    parser.add_argument("--probe", action="store_true", help="probe the host's mode around every launch")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.install:
        install_peers()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    size_arg = ",".join(map(str, sizes))
    names = {"pycomm": "pycomm", "pycomm-direct": "pycomm direct", "mpi": "Open MPI", "deepspeed": "DeepSpeed",
             "gloo": "gloo"}
    cases: list[Case] = []
    skipped: list[str] = []
    for peer in args.peers.split(","):
        why = available(peer)
        if why is not None:
            skipped.append(f"{names[peer]}: skipped, {why}")
            print(skipped[-1], flush=True)
            continue
        cases.append(Case(names[peer], peer, ROOT))
        if args.base is not None and peer == "pycomm":
            cases.append(Case("pycomm before", peer, args.base.resolve()))
    port = 32000 + os.getpid() % 1500
    workdir = tempfile.TemporaryDirectory()
    probe = HostProbe(Path(workdir.name)) if args.probe else None
    summary: dict[str, dict] = {}
    text = [f"float32 all_reduce (SUM, in place); median of {args.rounds} rounds, the peers alternating; "
            f"{time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.1f}\n"]
    text += [f"- {s}" for s in skipped]
    failed = False
    for config in args.configs.split(","):
        world, transport, btl = CONFIGS[config]
        here = [c for c in cases if c.applies(transport)]
        results: dict[str, list[dict]] = {c.label: [] for c in here}
        for r in range(args.rounds):
            order = here[r % len(here):] + here[:r % len(here)]
            for case in order:
                port += 1
                before = probe() if probe is not None else None
                try:
                    result = launch(case, world, transport, btl, size_arg, args, port)
                except RuntimeError as e:
                    print(e, flush=True)
                    failed = True
                    continue
                if probe is not None:
                    result["probe_us"] = [before, probe()]
                results[case.label].append(result)
                bad = {k: v for k, v in result["wrong"].items() if v}
                if bad:
                    print(f"{case.label} {config}: WRONG results (size: elements wrong on the worst rank) {bad}",
                          flush=True)
                    failed = True
                probed = f" (probes {result['probe_us'][0]:.1f}, {result['probe_us'][1]:.1f} us)" if probe else ""
                print(f"{config} round {r + 1} {case.label}{probed}: " +
                      " ".join(f"{format_size(int(k))}={v:.1f}us" for k, v in result["us"].items()), flush=True)
        summary[config] = {
            "world": world, "transport": transport,
            "median_us": {c.label: {str(n): statistics.median(x["us"][str(n)] for x in results[c.label]) for n in sizes}
                          for c in here if results[c.label]},
            "rounds": results,
        }
        text.append("\n" + table(config, world, transport, here, sizes, results, summary[config]["median_us"]))
        if probe is not None and summary[config]["median_us"]:
            text.append(by_mode(config, here, sizes, results))
    report = "\n".join(text)
    print(report)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "table.md").write_text(report)
        (args.out / "runs.json").write_text(json.dumps({"sizes": sizes, "configs": summary}, indent=1) + "\n")
        plot(args.out / "ratios.png", sizes, summary)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
