"""The settings of one training run, shared by the CLI, the launcher and every rank."""

from __future__ import annotations

import dataclasses

BACKENDS = ("pycomm", "gloo")
HOOKS = ("none", "fp16", "bf16", "fp8")

# Exit codes: 2 is reserved for usage errors (bad flags, a missing optional
# dependency that a flag asked for); 1 is any failure while training.
EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    backend: str = "pycomm"
    hook: str = "none"
    error_feedback: bool = False
    steps: int = 30
    batch_size: int = 8  # sequences per rank per step
    seed: int = 0
    lr: float = 3e-3
    eval_every: int = 10  # 0: validate only after the last step
    json_path: str | None = None
    plot_path: str | None = None
    nproc: int = 2  # local ranks when not under torchrun
    timeout_s: float = 120.0  # process-group timeout: a hung collective fails instead of hanging CI
    # The model and data are fixed rather than flags: the trainer is a
    # workload for the backend, and a fixed shape keeps runs comparable.
    context: int = 64
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    corpus_bytes: int = 3 << 20
    val_windows: int = 32  # validation sequences in total, split across ranks

    def tokens_per_step(self, world: int) -> int:
        return world * self.batch_size * self.context
