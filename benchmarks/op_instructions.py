"""Instructions per dist.all_reduce, counted by callgrind: a figure this host's noise cannot move.

Wall times of a small all-reduce here swing by up to 2x between launches and within one (the
host's modes, docs/PERFORMANCE.md); instruction counts do not (two runs agree within 0.1%). Each
layer runs at world 1 in one process under valgrind --tool=callgrind with instrumentation off;
after a warm-up it is switched on (callgrind_control) for `--ops` calls of dist.all_reduce on a
float32 tensor of `--bytes`, then off (the program waits for each switch before it goes on). Layers: torch's `fake` backend (its floor: Python wrapper,
dispatcher, c10d op, a Work), this checkout's pycomm, and `--base` checkouts' pycomm.

    python3 benchmarks/op_instructions.py [--install] [--ops 500] [--bytes 4096]
        [--base CHECKOUT ...] [--top 0] [--out FILE]

`--top N` also lists the N functions of each pycomm layer with the most instructions per op
(inclusive). Needs valgrind: `--install` installs it (apt-get).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROGRAM = r"""
import os, sys, time, torch, torch.distributed as dist
layer, nbytes, ops, port, flags = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
def await_flag(name):  # the controller's switch of counting has taken effect
    while not os.path.exists(os.path.join(flags, name)):
        time.sleep(0.2)  # few polls: those after "on" and before "off" are counted
if layer == "fake":
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
else:
    import pycomm
    dist.init_process_group("pycomm", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
t = torch.zeros(nbytes // 4)
for _ in range(300):
    dist.all_reduce(t)
print("READY", flush=True)
await_flag("on")
for _ in range(ops):
    dist.all_reduce(t)
print("DONE", flush=True)
await_flag("off")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(path: Path, word: str, proc: subprocess.Popen[bytes], errors: Path, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while word not in path.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"no {word} from the program; its stderr ends: "
                               f"{errors.read_text(errors='replace')[-2000:]}")
        time.sleep(0.2)


def switch(proc: subprocess.Popen[bytes], on: bool, flags: Path) -> None:
    """Counting on or off, then the flag the program waits for: it goes on only once the switch took."""
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(proc.pid)], check=True,
                   capture_output=True, timeout=120)
    (flags / ("on" if on else "off")).touch()


def count(layer: str, checkout: Path | None, args: argparse.Namespace, workdir: Path) -> Path:
    """Runs one layer under callgrind; returns its output file."""
    out = workdir / f"{layer}-{len(list(workdir.iterdir()))}.callgrind"
    stdout, stderr, flags = out.with_suffix(".stdout"), out.with_suffix(".stderr"), out.with_suffix(".flags")
    flags.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
               sys.executable, "-c", PROGRAM, layer, str(args.bytes), str(args.ops), str(free_port()), str(flags)]
    with open(stdout, "wb") as sink, open(stderr, "wb") as errors:
        proc = subprocess.Popen(command, env=env, stdout=sink, stderr=errors, cwd=checkout or ROOT)
        try:
            wait_for(stdout, "READY", proc, stderr, 600)
            switch(proc, True, flags)
            wait_for(stdout, "DONE", proc, stderr, 600)
            switch(proc, False, flags)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


def total(out: Path) -> int:
    for line in out.read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"{out}: no totals line")


def per_op(out: Path, ops: int) -> float:
    counted = total(out)
    if counted == 0:
        raise RuntimeError(f"{out}: nothing counted (callgrind's instrumentation never came on)")
    return counted / ops


def top_functions(out: Path, n: int, ops: int) -> list[str]:
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", str(out)], capture_output=True, text=True,
                          check=True).stdout
    best: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(\S.*)$", line)
        if match is None or "=>" in line or "pycomm::" not in match.group(2):
            continue
        # The same function may be listed under its source's absolute and relative path.
        name = match.group(2).split(" [")[0].split(":", 1)[-1]
        best[name] = max(best.get(name, 0), int(match.group(1).replace(",", "")))
    ranked = sorted(best.items(), key=lambda item: -item[1])[:n]
    return [f"{cost // ops:7d}  {name[:150]}" for name, cost in ranked]


def commit_of(checkout: Path) -> str:
    """The checkout's commit, which names it in the report (its path would name this machine)."""
    found = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                           text=True)
    # Changes to what the build and the measured program use, not to docs or results.
    dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no", "--",
                            "csrc", "pycomm", "setup.py", "CMakeLists.txt"], capture_output=True, text=True).stdout.strip()
    name = found.stdout.strip() if found.returncode == 0 else "not a git checkout"
    return f"{name} with changes" if dirty else name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=500)
    parser.add_argument("--bytes", type=int, default=4096)
    parser.add_argument("--base", type=Path, action="append", default=[],
                        help="another checkout (built in place): its pycomm too")
    parser.add_argument("--top", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--install", action="store_true", help="install valgrind (apt-get) if missing")
    args = parser.parse_args()
    if shutil.which("callgrind_control") is None and args.install:
        subprocess.run(["apt-get", "install", "-y", "valgrind"], check=True)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("op_instructions: needs valgrind (apt-get install valgrind, or --install)")
    layers: list[tuple[str, str, Path | None]] = [("torch floor (fake backend)", "fake", None),
                                                  (f"pycomm (this checkout, {commit_of(ROOT)})", "pycomm", ROOT)]
    layers += [(f"pycomm ({commit_of(base)})", "pycomm", base.resolve()) for base in args.base]
    lines = [f"Instructions per dist.all_reduce ({args.bytes} B float32, world 1, {args.ops} calls counted "
             "by callgrind after 300 warm-up calls)", "", "| layer | instructions per op |", "| --- | --- |"]
    tops: list[str] = []
    with tempfile.TemporaryDirectory(prefix="op-instructions-") as tmp:
        for name, layer, checkout in layers:
            out = count(layer, checkout, args, Path(tmp))
            lines.append(f"| {name} | {per_op(out, args.ops):,.0f} |")
            if args.top and layer == "pycomm":
                tops += ["", f"{name}: functions with the most instructions per op (inclusive)"]
                tops += top_functions(out, args.top, args.ops)
    report = "\n".join(lines + tops) + "\n"
    print(report, end="")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)


if __name__ == "__main__":
    main()
