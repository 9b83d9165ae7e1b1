"""What rank 0 writes: the summary line, the JSON log, the loss-curve PNG."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import platform
import tempfile
from typing import Any

import torch

from pycomm.train.config import TrainConfig
from pycomm.train.loop import TrainResult

SCHEMA = "pycomm.train/1"
COMM_METHOD = (
    "comm hook wrapped: time from hook call to completion of its future (compression included), "
    "union per step, over step wall time; warm-up steps excluded"
)


def summary(config: TrainConfig, result: TrainResult) -> str:
    val = result.val_loss[-1][1] if result.val_loss else float("nan")
    return (
        f"pycomm.train: backend {config.backend}, hook {config.hook} ({result.hook_impl}), "
        f"world {result.world_size}: train loss {result.train_loss[0]:.4f} -> {result.train_loss[-1]:.4f}, "
        f"val loss {val:.4f}, {result.tokens_per_s:,.0f} tokens/s, "
        f"comm {100 * result.comm_share:.1f}% of step time"
    )


def as_json(config: TrainConfig, result: TrainResult) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "config": {
            **dataclasses.asdict(config),
            "world_size": result.world_size,
            "hook_impl": result.hook_impl,
            "parameters": result.parameters,
            "corpus": result.corpus,
            "heap_kept": result.heap_kept,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "train_loss": result.train_loss,
        "val_loss": [{"step": step, "loss": loss} for step, loss in result.val_loss],
        "step_time_s": result.step_time_s,
        "comm_time_s": result.comm_time_s,
        "tokens_per_s": result.tokens_per_s,
        "comm_share": result.comm_share,
        "comm_method": COMM_METHOD,
        "timed_steps": result.timed_steps,
        "buckets_per_step": result.buckets_per_step,
    }


def write_json(path: str, document: dict[str, Any]) -> None:
    # Write-then-rename: a reader (or a killed run) never sees half a log.
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".train-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(document, out, indent=2)
            out.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def write_plot(path: str, config: TrainConfig, result: TrainResult) -> None:
    """Train loss per step and validation loss at each evaluation (matplotlib, imported only here)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on CI or on a remote rank
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    try:
        steps = range(1, len(result.train_loss) + 1)
        ax.plot(steps, result.train_loss, label="train (mean over ranks)", color="tab:blue")
        if result.val_loss:
            val_steps, val = zip(*result.val_loss)
            ax.plot(val_steps, val, "o-", label="validation", color="tab:orange")
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats per byte)")
        ax.set_title(
            f"{config.backend}, hook {config.hook}, world {result.world_size}: "
            f"{result.tokens_per_s:,.0f} tok/s, comm {100 * result.comm_share:.0f}%",
            fontsize=10,
        )
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
