"""What each rank runs: set up groups, sweep ops x sizes, report (rank 0).

Per size the work is done by measure.SizeMeasurement; see agreement.py for
the lock-step rule that keeps ranks from deadlocking when something fails.
"""

from __future__ import annotations

import datetime
import os
import platform
import socket
import sys
import traceback
from dataclasses import asdict
from types import ModuleType

import torch
import torch.distributed as dist

from pycomm.bench import data
from pycomm.bench.backends import BackendError, create_group, init_control, load_pycomm, one_line
from pycomm.bench.config import BenchConfig, Variant
from pycomm.bench.descriptors import COLLECTIVES, Collective
from pycomm.bench.measure import SizeMeasurement
from pycomm.bench.progress import Progress
from pycomm.bench.report import Row, Table, preamble, summary, write_json
from pycomm.bench.sizes import format_size

# Exit codes shared with the CLI: 2 is reserved for usage errors (argparse).
EXIT_OK = 0
EXIT_FAIL = 1

TRACEBACK_ENV = "PYCOMM_BENCH_TRACEBACK"


def run_rank(
    rank: int,
    world: int,
    local_world: int,
    config: BenchConfig,
    store_addr: tuple[str, int] | None = None,
) -> tuple[int, str | None]:
    """Run the whole benchmark on one rank. Returns (exit code, message);
    the message is a one-line error for the user, None when there is none."""
    # Ranks on one host share its cores: without this each rank's intra-op
    # pool would use all cores for fills and checks and they would thrash.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_world)))
    try:
        # pycomm must be imported (registering the backend) before any
        # process group exists; only done when it was asked for.
        pycomm = load_pycomm() if config.needs_pycomm else None
        init_control(rank, world, config.timeout_s, store_addr)
    except BackendError as exc:
        return EXIT_FAIL, str(exc)
    try:
        groups = [create_group(v, config, pycomm) for v in config.variants]
        return _Sweep(rank, world, config, groups, pycomm).run()
    except BackendError as exc:
        return EXIT_FAIL, str(exc)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class _Sweep:
    def __init__(
        self,
        rank: int,
        world: int,
        config: BenchConfig,
        groups: list[dist.ProcessGroup],
        pycomm: ModuleType | None,
    ) -> None:
        self.rank = rank
        self.world = world
        self.config = config
        self.groups = groups
        self.variants = config.variants
        self.dtype = data.torch_dtype(config.dtype)
        self.meta = self._meta(pycomm)
        self.table = Table(config)
        self.rows: list[Row] = []
        self.progress = Progress(len(config.ops) * len(config.sizes), enabled=None if rank == 0 else False)

    # -- output (rank 0 only) ------------------------------------------------

    def _print(self, lines: list[str]) -> None:
        if self.rank != 0:
            return
        self.progress.clear()
        print("\n".join(lines), flush=True)

    def _meta(self, pycomm: ModuleType | None) -> dict[str, object]:
        hosts: list[str | None] = [None] * self.world
        dist.all_gather_object(hosts, socket.gethostname(), group=dist.group.WORLD)
        unique_hosts = list(dict.fromkeys(h for h in hosts if h))
        return {
            "command": self.config.command,
            "world_size": self.world,
            "launcher": self.config.launcher,
            "host": hosts[0],
            "hosts": unique_hosts,
            "torch_version": torch.__version__,
            "memcpy_GBps": _memcpy_bandwidth(),
            "python_version": platform.python_version(),
            "pycomm_version": getattr(pycomm, "__version__", None) if pycomm else None,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "dtype": self.config.dtype,
            "ops": list(self.config.ops),
            "sizes": list(self.config.sizes),
            "variants": [asdict(v) for v in self.variants],
            "warmup": self.config.warmup,
            "iters": self.config.iters,
            "reps": self.config.reps,
            "target_time_s": self.config.target_time,
            "check": self.config.check,
            "threads_per_rank": torch.get_num_threads(),
        }

    # -- sweep ---------------------------------------------------------------

    def run(self) -> tuple[int, str | None]:
        self._print(preamble(self.meta, self.config) + [self.table.header()])
        for i, op in enumerate(self.config.ops):
            if i:
                self._print(["#"])
            self._sweep_op(COLLECTIVES[op])
        self.progress.clear()
        self._print(summary(self.rows, self.config))
        code, message = self._verdict()
        if self.rank == 0:
            self._write_outputs()
        return code, message

    def _sweep_op(self, coll: Collective) -> None:
        elem = self.dtype.itemsize
        layouts = [(s, coll.layout(s, elem, self.world)) for s in self.config.sizes]
        too_small = [s for s, lay in layouts if lay is None]
        if too_small:
            self._print([f"# {coll.name}: skipping sizes below {self.world} x {elem} bytes: {too_small}"])
        valid = [lay for _, lay in layouts if lay is not None]
        if not valid:
            for _ in layouts:
                self.progress.advance()
            return
        # One random pool per op, sliced per size: generating random data per
        # size would dominate small-size sweeps.
        pool = data.random_pool(max(lay.in_count for lay in valid), self.dtype, self.rank)
        period = data.pattern_period(self.dtype, self.world, [v.compression for v in self.variants])
        alive = [True] * len(self.variants)  # a variant that failed is dropped for this op
        for size, layout in layouts:
            self.progress.draw(f"{coll.name} {format_size(size)}")
            if layout is not None and any(alive):
                rows = SizeMeasurement(coll, layout, pool, period, self.config, self.groups, alive).run()
                self.rows.extend(rows)
                self._print([self.table.row(r) for r in rows])
            self.progress.advance()

    # -- end -----------------------------------------------------------------

    def _verdict(self) -> tuple[int, str | None]:
        failed = sorted({f"{r.op}/{r.label}" for r in self.rows if r.error is not None})
        wrong = sorted({f"{r.op}/{r.label}" for r in self.rows if r.wrong and _exact(r, self.variants)})
        problems = []
        if failed:
            problems.append("errors in " + ", ".join(failed))
        if wrong:
            problems.append("wrong results in " + ", ".join(wrong))
        if not problems:
            return EXIT_OK, None
        return EXIT_FAIL, ("FAILED: " + "; ".join(problems)) if self.rank == 0 else None

    def _write_outputs(self) -> None:
        if self.config.json_path:
            write_json(self.config.json_path, self.meta, self.rows)
            print(f"# wrote {self.config.json_path}", flush=True)
        if self.config.plot_path:
            from pycomm.bench.plot import write_plot  # matplotlib only when asked

            write_plot(self.config.plot_path, self.rows, self.meta)
            print(f"# wrote {self.config.plot_path}", flush=True)


def _exact(row: Row, variants: tuple[Variant, ...]) -> bool:
    return any(v.label == row.label and v.exact for v in variants)


def spawn_entry(rank: int, store_addr: tuple[str, int], world: int, config: BenchConfig, results: object) -> None:
    """What each rank the launcher forks runs (pycomm.ranks.fork_ranks)."""
    code: int = EXIT_FAIL
    message: str | None = "crashed"
    try:
        code, message = run_rank(rank, world, world, config, store_addr)
    except KeyboardInterrupt:
        code, message = 130, None
    except Exception as exc:  # unexpected (a peer died, or a bench bug): one line
        code, message = EXIT_FAIL, f"rank {rank}: {one_line(exc)}"
        if os.environ.get(TRACEBACK_ENV) == "1":
            traceback.print_exc()
        else:
            message += f" (set {TRACEBACK_ENV}=1 for the traceback)"
    finally:
        results.put((rank, code, message))  # type: ignore[attr-defined]
    sys.exit(code)


def _memcpy_bandwidth(nbytes: int = 64 << 20, reps: int = 5) -> float:
    """This rank's copy bandwidth in GB/s (median of a few 64 MiB copies), measured in the same run
    as the collectives, so busbw can be read as a fraction of what the memory can do."""
    import statistics
    import time

    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in first
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9
