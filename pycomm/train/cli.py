"""Command line: parse and check flags, build a TrainConfig, launch the ranks.

Usage errors (a bad flag, or a flag whose dependency is missing) exit 2 with
one line on stderr, before any rank starts: no rendezvous to wait out, and one
precise line is what a CI log needs.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from pycomm.ranks import under_torchrun
from pycomm.train.config import BACKENDS, EXIT_FAIL, EXIT_USAGE, FAIL_SIGNALS, HOOKS, MODELS, TrainConfig

PROG = "pycomm.train"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())} (see --help)\n")


def _number(kind: Callable[[str], float], low: float, inclusive: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
            ) from None
        if value < low or (value == low and not inclusive) or math.isnan(value):
            raise argparse.ArgumentTypeError(f"expected a value {'>=' if inclusive else '>'} {low:g}, got {text!r}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Train a character-level transformer on the Python standard library's source, "
        "data parallel (DDP) over pycomm or gloo, and report the loss curves, tokens/s, the exposed "
        "communication time and the bytes on the wire.",
        epilog="Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR set) the launched ranks join via env://, on any "
        "number of hosts; otherwise --nproc ranks are started here. Exit codes: 0 ok, 1 failure, 2 usage error.",
    )
    p.add_argument("--backend", choices=BACKENDS, default="pycomm", help="torch.distributed backend (default pycomm)")
    p.add_argument(
        "--hook",
        choices=HOOKS,
        default="none",
        help="DDP comm hook: none (fp32 all-reduce) or gradient compression; pycomm.hooks when present, "
        "else torch's for fp16/bf16 (default none)",
    )
    p.add_argument("--error-feedback", action="store_true", help="error feedback for compression (pycomm.hooks)")
    p.add_argument(
        "--model",
        choices=tuple(MODELS),
        default="small",
        help="model preset: "
        + "; ".join(f"{name}: {preset.about} (batch {preset.batch_size})" for name, preset in MODELS.items())
        + " (default small)",
    )
    p.add_argument("--steps", type=_number(int, 1, True), default=30, help="optimizer steps (default 30)")
    p.add_argument(
        "--batch-size",
        type=_number(int, 1, True),
        default=None,
        help="sequences per rank per step (default: the --model preset's)",
    )
    p.add_argument("--seed", type=_number(int, 0, True), default=0, help="seed for weights and batches (default 0)")
    p.add_argument("--lr", type=_number(float, 0, False), default=3e-3, help="AdamW learning rate (default 3e-3)")
    p.add_argument(
        "--eval-every",
        type=_number(int, 0, True),
        default=10,
        help="validate every N steps, and after the last; 0: only after the last (default 10)",
    )
    p.add_argument("--json", metavar="PATH", help="write the run's log (config, loss curves, tokens/s, exposed comm, bytes on the wire) here")
    p.add_argument("--plot", metavar="PATH", help="write the loss curves and step times here as PNG (needs matplotlib)")
    p.add_argument(
        "--nproc", type=_number(int, 1, True), default=2, help="local ranks to start (default 2; not under torchrun)"
    )
    p.add_argument(
        "--timeout",
        type=_number(float, 0, False),
        default=120.0,
        metavar="SECONDS",
        help="process-group timeout: a hung collective fails after this long (default 120)",
    )
    p.add_argument(
        "--accum-steps",
        type=_number(int, 1, True),
        default=1,
        metavar="K",
        help="micro-batches per optimizer step; gradients are all-reduced once per step, after the "
        "K-th (DDP no_sync on the others) (default 1)",
    )
    ckpt = p.add_argument_group("checkpoints", "rank 0 writes them atomically; a run resumes from the newest")
    ckpt.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="write checkpoints here (the same directory for every rank); a run whose DIR holds one resumes from it",
    )
    ckpt.add_argument(
        "--checkpoint-every",
        type=_number(int, 0, True),
        default=0,
        metavar="N",
        help="checkpoint every N steps, and after the last; 0: only after the last (default 0)",
    )
    ckpt.add_argument("--resume", action="store_true", help="resume from DIR's newest checkpoint; an error if none")
    p.add_argument(
        "--on-failure",
        choices=("stop", "shrink"),
        default="stop",
        help="when a rank is lost: stop (the run fails; under torchrun --max-restarts it restarts from the last "
        "checkpoint) or shrink (the others shrink the group and finish without it) (default stop)",
    )
    faults = p.add_argument_group("fault injection", "for tests and demos; fires once per run, not after a restart")
    faults.add_argument("--fail-rank", type=_number(int, 0, True), default=None, metavar="R", help="the rank to fail")
    faults.add_argument(
        "--fail-at-step", type=_number(int, 1, True), default=None, metavar="S", help="the step (1-based) it fails in"
    )
    faults.add_argument(
        "--fail-signal", choices=FAIL_SIGNALS, default="KILL", help="the signal it sends itself (default KILL)"
    )
    return p


class UsageError(Exception):
    pass


def parse_config(argv: Sequence[str] | None = None) -> TrainConfig:
    args = build_parser().parse_args(argv)
    if args.seed >= 1 << 63:
        raise UsageError(f"--seed must be below 2**63, got {args.seed}")
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise UsageError(f"{flag}: directory of {path!r} does not exist")
    if args.plot is not None:
        from pycomm.train.report import have_matplotlib

        if not have_matplotlib():
            raise UsageError("--plot needs matplotlib (pip install matplotlib)")
    from pycomm.train.hooks import HookUnavailable, check_hook

    try:
        check_hook(args.hook, args.error_feedback)
    except HookUnavailable as exc:
        raise UsageError(str(exc)) from None
    _check_fault_flags(args)
    if args.on_failure == "shrink":
        if args.backend != "pycomm":
            raise UsageError("--on-failure shrink needs --backend pycomm (the only CPU backend that shrinks)")
        if args.checkpoint_dir is not None:
            raise UsageError("--on-failure shrink and --checkpoint-dir are two recoveries: choose one")
        if under_torchrun():
            raise UsageError("--on-failure shrink needs the trainer's own launcher (--nproc): torchrun's agent "
                             "restarts every worker when one is lost")
    if args.checkpoint_dir is None:
        for flag, given in (("--resume", args.resume), ("--checkpoint-every", args.checkpoint_every)):
            if given:
                raise UsageError(f"{flag} needs --checkpoint-dir")
    elif os.path.exists(args.checkpoint_dir) and not os.path.isdir(args.checkpoint_dir):
        raise UsageError(f"--checkpoint-dir: {args.checkpoint_dir!r} is not a directory")
    config = TrainConfig.for_model(
        args.model,
        backend=args.backend,
        hook=args.hook,
        error_feedback=args.error_feedback,
        steps=args.steps,
        batch_size=args.batch_size,
        seed=args.seed,
        lr=args.lr,
        eval_every=args.eval_every,
        json_path=args.json,
        plot_path=args.plot,
        nproc=args.nproc,
        timeout_s=args.timeout,
        accum_steps=args.accum_steps,
        checkpoint_dir=None if args.checkpoint_dir is None else os.path.abspath(args.checkpoint_dir),
        checkpoint_every=args.checkpoint_every,
        fail_rank=args.fail_rank,
        fail_at_step=args.fail_at_step,
        fail_signal=args.fail_signal,
        on_failure=args.on_failure,
    )
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else config.nproc
    if config.fail_rank is not None and config.fail_rank >= world:
        raise UsageError(f"--fail-rank {config.fail_rank} is not a rank of world size {world}")
    if config.fail_at_step is not None and config.fail_at_step > config.steps:
        raise UsageError(f"--fail-at-step {config.fail_at_step} is past --steps {config.steps}")
    if config.checkpoint_dir is None:
        return config
    from pycomm.train.checkpoint import CheckpointError, resume_point

    try:
        latest = resume_point(config.checkpoint_dir, config, world, required=args.resume)
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None
    return config if latest is None else dataclasses.replace(config, resume_path=latest.path)


def _check_fault_flags(args: argparse.Namespace) -> None:
    if (args.fail_rank is None) != (args.fail_at_step is None):
        raise UsageError("--fail-rank and --fail-at-step go together")


def main(argv: Sequence[str] | None = None) -> int:
    from pycomm.train import launch

    try:
        config = parse_config(argv)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except Exception as exc:  # e.g. pycomm.hooks present but failing to import: one line, not a traceback
        if os.environ.get(launch.TRACEBACK_ENV) == "1":
            raise
        print(f"{PROG}: error: {launch.one_line(exc)}", file=sys.stderr, flush=True)
        return EXIT_FAIL
    if under_torchrun():
        return launch.run_existing_rank(config)
    return launch.run_local(config)
