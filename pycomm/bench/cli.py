"""Command line: parse and validate flags, build a BenchConfig, launch ranks.

Usage errors exit 2 with a single line on stderr (argparse's usage dump is
suppressed: in CI logs one precise line is easier to act on).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from pycomm.bench.config import DTYPES, PYCOMM, BenchConfig, build_variants
from pycomm.bench.descriptors_names import OP_NAMES
from pycomm.bench.sizes import parse_size, parse_size_range, sweep
from pycomm.ranks import under_torchrun

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())  # force a single line
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _comma_list(text: str) -> list[str]:
    items = [item.strip() for item in text.split(",")]
    if not items or any(not item for item in items):
        raise argparse.ArgumentTypeError(f"bad list {text!r} (expected comma-separated names)")
    return items


def _ops(text: str) -> list[str]:
    if text.strip() == "all":
        return list(OP_NAMES)
    ops = _comma_list(text)
    unknown = [op for op in ops if op not in OP_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown op {unknown[0]!r} (choose from {', '.join(OP_NAMES)}, all)")
    return list(dict.fromkeys(ops))


def _size_range(text: str) -> tuple[int, int]:
    try:
        return parse_size_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1)
_nonnegative_int = _int_at_least(0)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="pycomm.bench",
        description="Collective-communication microbenchmarks (nccl-tests style) for pycomm and other "
        "torch.distributed backends, measured side by side in the same ranks.",
        epilog="Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR set) the existing ranks are used, on any number of hosts; "
        "otherwise --nproc ranks are started on this host. Exit codes: 0 ok, 1 failure or wrong results, "
        "2 usage error.",
    )
    p.add_argument(
        "--op",
        type=_ops,
        default=["all_reduce"],
        metavar="OPS",
        help=f"op or comma list, or 'all' ({', '.join(OP_NAMES)}); default all_reduce",
    )
    p.add_argument(
        "--sizes",
        type=_size_range,
        default=(4 << 10, 64 << 20),
        metavar="LO:HI",
        help="size range in bytes per rank, K/M/G suffixes (default 4K:64M)",
    )
    p.add_argument("--factor", type=float, default=2.0, help="multiplicative size step (default 2)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="element type (default float32)")
    p.add_argument(
        "--backends",
        type=_comma_list,
        default=[PYCOMM, "gloo"],
        metavar="LIST",
        help="backends measured side by side; ratio is relative to the first (default pycomm,gloo)",
    )
    p.add_argument(
        "--algo",
        type=_comma_list,
        default=None,
        metavar="LIST",
        help="pycomm algorithm(s); a list makes one pycomm variant each",
    )
    p.add_argument(
        "--compression",
        type=_comma_list,
        default=None,
        metavar="LIST",
        help="pycomm compression codec(s); a list makes one pycomm variant each",
    )
    p.add_argument("--transport", default=None, help="pycomm transport")
    p.add_argument(
        "--chunk-bytes",
        type=lambda text: [_size(part) for part in _comma_list(text)],
        default=None,
        metavar="LIST",
        help="pycomm chunk size(s); e.g. 512K,1G compares pipelined against one chunk",
    )
    p.add_argument(
        "--tune",
        action="store_true",
        help="measure ring, tree and rhd all_reduce over TCP and write the cost-model table auto uses",
    )
    p.add_argument(
        "--tune-out",
        default=None,
        metavar="PATH",
        help="where --tune writes the table (default: the user cache that pycomm reads)",
    )
    p.add_argument(
        "--nproc", type=_positive_int, default=None, help="local ranks to start (default 2; ignored under torchrun)"
    )
    p.add_argument("--warmup", type=_nonnegative_int, default=5, help="warm-up calls per size (default 5)")
    p.add_argument(
        "--iters", type=_positive_int, default=None, help="calls per timed rep (default: auto, from --target-time)"
    )
    p.add_argument(
        "--reps", type=_positive_int, default=5, help="timed reps per size; the median is reported (default 5)"
    )
    p.add_argument(
        "--target-time",
        type=_positive_float,
        default=0.2,
        metavar="SECONDS",
        help="auto iters aim at this much timed work per size per backend (default 0.2)",
    )
    p.add_argument("--max-iters", type=_positive_int, default=1000, help="cap on auto iters per rep (default 1000)")
    p.add_argument(
        "--check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="count wrong elements after the timed loop (default on)",
    )
    p.add_argument(
        "--timeout", type=_positive_float, default=120.0, metavar="SECONDS", help="process-group timeout (default 120)"
    )
    p.add_argument("--json", default=None, metavar="PATH", help="write results as one JSON document")
    p.add_argument("--plot", default=None, metavar="PATH", help="write a busbw-vs-size PNG (needs matplotlib)")
    return p


def config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: Sequence[str]) -> BenchConfig:
    """Cross-flag validation and defaults; parser.error() exits 2."""
    if args.factor <= 1:
        parser.error(f"argument --factor: must be > 1, got {args.factor:g}")
    if args.warmup == 0 and args.iters is None:
        parser.error("argument --warmup: 0 needs --iters (warm-up calls estimate the auto iteration count)")
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            parser.error(f"argument {flag}: directory of {path!r} does not exist")
    if args.plot:
        from pycomm.bench.plot import INSTALL_HINT, matplotlib_available

        if not matplotlib_available():
            parser.error(f"argument --plot: {INSTALL_HINT}")
    notes: list[str] = []
    pycomm_flags = [
        f
        for f, v in (
            ("--algo", args.algo),
            ("--compression", args.compression),
            ("--transport", args.transport),
            ("--chunk-bytes", args.chunk_bytes),
        )
        if v
    ]
    if pycomm_flags and PYCOMM not in args.backends:
        notes.append(f"{', '.join(pycomm_flags)} only apply to the pycomm backend, which is not in --backends")
    torchrun = under_torchrun()
    if torchrun and args.nproc is not None:
        notes.append("--nproc ignored: ranks come from the launcher (RANK, WORLD_SIZE, MASTER_ADDR set)")
    lo, hi = args.sizes
    nproc = args.nproc or 2
    return BenchConfig(
        ops=tuple(args.op),
        sizes=tuple(sweep(lo, hi, args.factor)),
        dtype=DTYPES[args.dtype],
        variants=build_variants(args.backends, args.algo, args.compression, args.transport, args.chunk_bytes),
        warmup=args.warmup,
        iters=args.iters,
        reps=args.reps,
        target_time=args.target_time,
        max_iters=args.max_iters,
        check=args.check,
        timeout_s=args.timeout,
        json_path=args.json,
        plot_path=args.plot,
        command=shlex.join(["python", "-m", "pycomm.bench", *argv]),
        launcher="torchrun" if torchrun else f"{nproc} local rank{'s' if nproc > 1 else ''}",
        notes=tuple(notes),
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    # Deferred: both import torch, and `--help` or a usage error should not wait for it.
    if args.tune:
        from pycomm.bench import tune

        tune.prepare_args(args)
        return tune.tune(config_from_args(args, parser, argv), args.nproc or 2, args.tune_out, argv)
    from pycomm.bench.launch import run

    return run(config_from_args(args, parser, argv), args.nproc or 2)
