"""What rank 0 writes: the summary, the JSON log, the PNG of loss curves and step times.

The run report has three parts, in the summary and the JSON alike: exposed
communication time (hooks.CommTimer: what the step waited for once backward's
gradients were all computed), bytes on the wire (wire.WireCounter: pycomm's
per-rank counters around each step), and the loss curves (train per step,
validation at each evaluation).
"""

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
from pycomm.train.loop import TrainResult, warmup_steps

SCHEMA = "pycomm.train/1"  # fields are only ever added under one schema
COMM_METHOD = (
    "comm hook wrapped: time from hook call to completion of its future (compression included), "
    "union per step, over step wall time; warm-up steps excluded"
)
EXPOSED_COMM_METHOD = (
    "per step: from the last bucket's hook call (backward's gradients all computed) to the completion of the "
    "last hook future (compression and decompression included): communication the step waited for, "
    "not hidden behind compute; share = sum over timed steps / step time, mean over ranks"
)
WIRE_METHOD = (
    "pycomm.stats() deltas around each step, per rank: socket_* = frame bytes through TCP sockets, "
    "shm_ring_sent = frame bytes through same-host shared-memory rings, payload_sent = the collectives' "
    "own count; fp32 all-reduce as a one-host shared-memory collective counts nothing (PYCOMM_TRANSPORT=tcp "
    "sends it over sockets); a step is an optimizer step, all of its --accum-steps micro-batches"
)
MB = 1e6


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def per_step_wire(result: TrainResult, timed_only: bool = True) -> dict[str, float]:
    """Each wire count per step and rank, the mean over ranks and (timed) steps."""
    skip = warmup_steps(len(result.train_loss)) if timed_only else 0
    return {
        field: _mean([float(sum(steps[skip:])) / max(1, len(steps) - skip) for steps in by_rank])
        for field, by_rank in result.wire_bytes.items()
    }


def wire_totals(result: TrainResult) -> dict[str, int]:
    """Each wire count summed over every rank and step (warm-up included)."""
    return {field: sum(sum(steps) for steps in by_rank) for field, by_rank in result.wire_bytes.items()}


def exposed_per_step(result: TrainResult) -> float:
    """Exposed comm seconds per timed step, mean over ranks."""
    skip = warmup_steps(len(result.train_loss))
    return _mean([_mean(steps[skip:]) for steps in result.exposed_comm_s])


def summary(config: TrainConfig, result: TrainResult) -> str:
    """The end-of-run report: a headline, then communication, bytes and the loss curve."""
    val = result.val_loss[-1][1] if result.val_loss else float("nan")
    lines = [
        f"pycomm.train: model {config.model} ({result.parameters:,} parameters), backend {config.backend}, "
        f"hook {config.hook}{' +ef' if config.error_feedback else ''} ({result.hook_impl}), "
        f"world {result.world_size}: train loss {result.train_loss[0]:.4f} -> {result.train_loss[-1]:.4f}, "
        f"val loss {val:.4f}, {result.tokens_per_s:,.0f} tokens/s, "
        f"comm {100 * result.comm_share:.1f}% of step time"
    ]
    step_s = _mean([_mean(steps[warmup_steps(len(steps)) :]) for steps in result.step_time_by_rank_s])
    exposed = exposed_per_step(result)
    lines.append(
        f"  per step (mean of {result.timed_steps} timed steps and {result.world_size} ranks): "
        f"{step_s:.3f} s, of which exposed comm {exposed:.3f} s ({100 * result.exposed_comm_share:.1f}%), "
        f"compute and the rest {max(0.0, step_s - exposed):.3f} s"
    )
    if result.wire_counted:
        wire = per_step_wire(result)
        per_micro = f" (a step: one optimizer step, {config.accum_steps} micro-batches)" if config.accum_steps > 1 else ""
        lines.append(
            f"  bytes per step and rank{per_micro}: socket sent {wire['socket_sent'] / MB:.2f} MB, received "
            f"{wire['socket_received'] / MB:.2f} MB, shm rings {wire['shm_ring_sent'] / MB:.2f} MB, "
            f"payload {wire['payload_sent'] / MB:.2f} MB; fp32 gradient {result.gradient_bytes / MB:.2f} MB; "
            f"in total (all ranks and steps) {wire_totals(result)['socket_sent'] / MB:,.1f} MB sent over sockets"
        )
    else:
        lines.append(f"  bytes: not counted over {config.backend} (pycomm only)")
    if result.lost_ranks:
        lines.append(f"  went on without rank(s) {result.lost_ranks} (--on-failure shrink): from then on the world and "
                     f"the global batch were {result.world_size} ranks' (the mean losses are over the rows of the ranks still there)")
    if result.resumed_from_step is not None:
        lines.append(f"  resumed from a checkpoint after step {result.resumed_from_step}; earlier figures are from its run")
    lines.append("  val loss: " + ", ".join(f"step {step} {loss:.4f}" for step, loss in result.val_loss))
    lines.append("  train loss: " + ", ".join(f"step {step} {loss:.4f}" for step, loss in _train_points(result)))
    return "\n".join(lines)


def _train_points(result: TrainResult, points: int = 6) -> list[tuple[int, float]]:
    """A few (step, train loss) points, evenly spaced, first and last included (steps 1-based)."""
    n = len(result.train_loss)
    picks = sorted({round(i * (n - 1) / (points - 1)) for i in range(points)}) if n > 1 else [0]
    return [(i + 1, result.train_loss[i]) for i in picks]


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
        "resumed_from_step": result.resumed_from_step,
        "lost_ranks": result.lost_ranks,
        "train_loss": result.train_loss,
        "val_loss": [{"step": step, "loss": loss} for step, loss in result.val_loss],
        "step_time_s": result.step_time_s,
        "comm_time_s": result.comm_time_s,
        "tokens_per_s": result.tokens_per_s,
        "comm_share": result.comm_share,
        "comm_method": COMM_METHOD,
        "timed_steps": result.timed_steps,
        "buckets_per_step": result.buckets_per_step,
        "step_time_by_rank_s": result.step_time_by_rank_s,
        "exposed_comm_s": result.exposed_comm_s,
        "exposed_comm_per_step_s": exposed_per_step(result),
        "exposed_comm_total_s": exposed_per_step(result) * result.timed_steps,
        "exposed_comm_share": result.exposed_comm_share,
        "exposed_comm_method": EXPOSED_COMM_METHOD,
        "wire": {
            "counted": result.wire_counted,
            "gradient_bytes": result.gradient_bytes,
            "per_step_and_rank": per_step_wire(result),  # a step is an optimizer step (all its micro-batches)
            "per_micro_batch_and_rank": {
                field: count / config.accum_steps for field, count in per_step_wire(result).items()
            },
            "total": wire_totals(result),
            "by_rank": result.wire_bytes,
            "method": WIRE_METHOD,
        },
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
    """Loss curves (train per step, validation at each evaluation) and each step's time split."""
    import matplotlib

    matplotlib.use("Agg")  # no display on CI or on a remote rank
    import matplotlib.pyplot as plt

    fig, (losses, times) = plt.subplots(2, 1, figsize=(7, 6.4), dpi=100, height_ratios=(3, 2), sharex=True)
    try:
        steps = list(range(1, len(result.train_loss) + 1))
        losses.plot(steps, result.train_loss, label="train (mean over ranks)", color="tab:blue")
        if result.val_loss:
            val_steps, val = zip(*result.val_loss)
            losses.plot(val_steps, val, "o-", label="validation", color="tab:orange")
        losses.set_ylabel("loss (nats per byte)")
        ef = " +ef" if config.error_feedback else ""
        losses.set_title(
            f"model {config.model}, {config.backend}, hook {config.hook}{ef}, world {result.world_size}: "
            f"{result.tokens_per_s:,.0f} tok/s, exposed comm {100 * result.exposed_comm_share:.0f}%",
            fontsize=10,
        )
        losses.grid(alpha=0.3)
        losses.legend()
        world = len(result.step_time_by_rank_s)
        step_s = [sum(rank[i] for rank in result.step_time_by_rank_s) / world for i in range(len(steps))]
        exposed = [sum(rank[i] for rank in result.exposed_comm_s) / world for i in range(len(steps))]
        times.plot(steps, step_s, label="step", color="tab:gray")
        times.fill_between(steps, exposed, label="exposed comm", color="tab:red", alpha=0.4)
        times.set_xlabel("step")
        times.set_ylabel("seconds (mean over ranks)")
        times.grid(alpha=0.3)
        times.legend(loc="upper right")
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
