"""The settings of one training run, shared by the CLI, the launcher and every rank."""

from __future__ import annotations

import dataclasses

BACKENDS = ("pycomm", "gloo")
HOOKS = ("none", "fp16", "bf16", "fp8")
FAIL_SIGNALS = ("KILL", "STOP")


@dataclasses.dataclass(frozen=True)
class ModelPreset:
    """A named model shape (``--model``), with the batch size that suits it."""

    d_model: int
    n_heads: int
    n_layers: int
    context: int
    hash_buckets: int  # rows of the hashed n-gram embedding (pycomm.train.ngram); 0: none
    batch_size: int  # default sequences per rank per step
    fused_adamw: bool  # torch's fused AdamW: one pass over the parameters instead of several
    about: str


MODELS = {
    # Exactly the trainer's original model: same weights, same optimizer, same results.
    "small": ModelPreset(
        d_model=64, n_heads=4, n_layers=2, context=64, hash_buckets=0, batch_size=8, fused_adamw=False,
        about="0.14M parameters; compute-bound, a quick check",
    ),
    # Most parameters in the hashed bigram/trigram table: each step looks up
    # only a few hundred rows (cheap), but the table's gradient is dense, so
    # DDP all-reduces ~90 MB of fp32 a step. Small batches keep compute to
    # ~0.1 s a step per rank, so over a slow link communication dominates.
    "large": ModelPreset(
        d_model=256, n_heads=4, n_layers=2, context=64, hash_buckets=81920, batch_size=2, fused_adamw=True,
        about="22.7M parameters (21M in a hashed n-gram embedding); communication-bound over a slow link",
    ),
}

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
    batch_size: int = 8  # sequences per rank per step (the preset's unless --batch-size)
    seed: int = 0
    lr: float = 3e-3
    eval_every: int = 10  # 0: validate only after the last step
    json_path: str | None = None
    plot_path: str | None = None
    nproc: int = 2  # local ranks when not under torchrun
    timeout_s: float = 120.0  # process-group timeout: a hung collective fails instead of hanging CI
    # The model's shape comes from a named preset (--model), not from one
    # flag per dimension: the trainer is a workload for the backend, and a few
    # fixed shapes keep runs comparable. The defaults are the small preset's.
    model: str = "small"
    context: int = 64
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    hash_buckets: int = 0
    fused_adamw: bool = False
    corpus_bytes: int = 3 << 20
    val_windows: int = 32  # validation sequences in total, split across ranks
    # Gradient accumulation: micro-batches per optimizer step; DDP synchronizes on the last only.
    accum_steps: int = 1
    # Checkpoints (pycomm.train.checkpoint): rank 0 writes to checkpoint_dir every
    # checkpoint_every steps (0: only after the last); resume_path is the checkpoint
    # this run starts from, resolved by the CLI (None: from step 0).
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume_path: str | None = None
    # Fault injection (pycomm.train.faults): rank fail_rank sends itself SIGfail_signal
    # during step fail_at_step (1-based), once per run.
    fail_rank: int | None = None
    fail_at_step: int | None = None
    fail_signal: str = "KILL"
    # What a lost rank does to the run: "stop" (the run fails; a torchrun restart resumes it from a
    # checkpoint) or "shrink" (the survivors carry on without it: pycomm.train.recovery).
    on_failure: str = "stop"

    @classmethod
    def for_model(cls, model: str = "small", *, batch_size: int | None = None, **settings: object) -> TrainConfig:
        """A config with the preset's shape, and its batch size unless one is given."""
        try:
            preset = MODELS[model]
        except KeyError:
            raise ValueError(f"unknown model {model!r}; known: {', '.join(MODELS)}") from None
        shape = {f.name: getattr(preset, f.name) for f in dataclasses.fields(preset) if f.name != "about"}
        if batch_size is not None:
            shape["batch_size"] = batch_size
        return cls(
            model=model,
            **shape,  # type: ignore[arg-type]
            **settings,  # type: ignore[arg-type]
        )

    def tokens_per_step(self, world: int) -> int:
        """Tokens of one optimizer step, all ranks and micro-batches together."""
        return world * self.accum_steps * self.batch_size * self.context
