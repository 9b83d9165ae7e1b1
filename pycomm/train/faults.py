"""Fault injection for tests and demos: ``--fail-rank R --fail-at-step S [--fail-signal KILL|STOP]``.

Rank R sends itself the signal during step S (1-based): after that step's forward pass, before
its backward, so the other ranks are already waiting in the step's gradient all-reduce when it
goes, as they would be when a host dies mid-step.

It fires once per run, never again after a restart or a resume:

- with ``--checkpoint-dir``, the rank first writes (and fsyncs) a marker file there naming the
  rank and step; a later incarnation of the run (a torchrun restart, or the same command run
  again to resume) finds it and does not fire;
- without one, a torchrun restart is recognized by ``TORCHELASTIC_RESTART_COUNT`` > 0;
- a run that resumes past step S never reaches it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys

from pycomm.train.config import TrainConfig

RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"  # set by torchrun's agent in each worker


@dataclasses.dataclass(frozen=True)
class FaultPlan:
    rank: int
    step: int  # 1-based
    signal: signal.Signals
    marker: str | None  # the file that records that it fired; None without a checkpoint directory

    @classmethod
    def of(cls, config: TrainConfig) -> FaultPlan | None:
        if config.fail_rank is None or config.fail_at_step is None:
            return None
        marker = None
        if config.checkpoint_dir is not None:
            name = f"fault-fired-rank{config.fail_rank}-step{config.fail_at_step}"
            marker = os.path.join(config.checkpoint_dir, name)
        return cls(config.fail_rank, config.fail_at_step, signal.Signals[f"SIG{config.fail_signal}"], marker)

    def already_fired(self) -> bool:
        if self.marker is not None:
            return os.path.exists(self.marker)
        return int(os.environ.get(RESTART_COUNT_ENV, "0")) > 0

    def maybe_fire(self, rank: int, step: int) -> None:
        """Send the signal if this is rank R in step S and it has not fired in this run before."""
        if rank != self.rank or step != self.step or self.already_fired():
            return
        if self.marker is not None:
            _write_marker(self.marker, f"rank {rank} sent itself {self.signal.name} in step {step}\n")
        print(f"pycomm.train: fault injection: rank {rank} sends itself {self.signal.name} in step {step}",
              file=sys.stderr, flush=True)
        os.kill(os.getpid(), self.signal)


def _write_marker(path: str, text: str) -> None:
    # Durable before the signal: a SIGKILL right after must not lose the record that it fired.
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    dir_fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
