"""What each rank runs: build data and model, train under DDP, evaluate, summarize."""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from pycomm.train import data
from pycomm.train.config import TrainConfig
from pycomm.train.hooks import CommTimer, choose_hook
from pycomm.train.memory import keep_freed_memory
from pycomm.train.model import CharTransformer, lm_loss, parameter_count
from pycomm.train.wire import FIELDS as WIRE_FIELDS
from pycomm.train.wire import WireCounter

GRAD_CLIP = 1.0


@dataclasses.dataclass
class TrainResult:
    """What rank 0 reports. Train losses are the mean over ranks of each step's loss."""

    world_size: int
    hook_impl: str
    parameters: int
    corpus: dict[str, object]
    train_loss: list[float]
    val_loss: list[tuple[int, float]]  # (steps done, loss)
    step_time_s: list[float]  # rank 0's wall time of each step
    comm_time_s: list[float]  # rank 0's comm time within each step (CommTimer's busy time)
    buckets_per_step: int
    timed_steps: int  # steps after the warm-up ones, used for the figures below
    tokens_per_s: float  # all ranks together
    comm_share: float  # comm time / step time, averaged over ranks
    # Per rank and step ([rank][step]), every rank's, not only rank 0's:
    step_time_by_rank_s: list[list[float]]
    exposed_comm_s: list[list[float]]  # see CommTimer: comm the step waited for after backward
    wire_bytes: dict[str, list[list[int]]]  # wire.FIELDS -> [rank][step]
    wire_counted: bool  # False over gloo: no counters, wire_bytes all 0
    gradient_bytes: int  # fp32 bytes of one rank's gradient: what an uncompressed all-reduce reduces
    exposed_comm_share: float  # exposed comm / step time over the timed steps, averaged over ranks
    heap_kept: bool  # whether memory.keep_freed_memory took effect on rank 0


def warmup_steps(steps: int) -> int:
    # The first step pays one-off costs (allocations, DDP's lazy setup) that
    # would skew throughput at tens of steps; it is left out of the figures.
    return 1 if steps > 1 else 0


def train(config: TrainConfig, on_progress: bool) -> TrainResult:
    """Train on the already-initialized default process group. Collective: every rank calls it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    heap_kept = keep_freed_memory()  # before the first large tensor: no page faults per step
    corpus = data.load_corpus(config.corpus_bytes, config.context)
    _check_same_corpus(corpus)

    # Every rank builds the same initial weights from the seed (DDP would
    # broadcast rank 0's anyway; this keeps a world-1 run identical too).
    torch.manual_seed(config.seed)
    model = CharTransformer(
        data.VOCAB_SIZE, config.context, config.d_model, config.n_heads, config.n_layers, config.hash_buckets
    )
    # Gradients as views into DDP's buckets: no copy of each gradient into
    # its bucket and back per step (two passes over ~90 MB for the large
    # model); the same numbers either way.
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
    choice = choose_hook(config.hook, config.error_feedback)
    timer = CommTimer()
    ddp.register_comm_hook(choice.state, timer.wrap(choice.hook))
    # fused=None is torch's default (a per-parameter loop on CPU): the small
    # model's results predate the option and stay as they were.
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=config.lr, fused=True if config.fused_adamw else None)
    wire = WireCounter()

    local_loss = torch.zeros(config.steps, dtype=torch.float64)
    # Per step: wall time, comm busy time, exposed comm time; and the wire counts.
    local_times = torch.zeros(world, config.steps, 3, dtype=torch.float64)
    local_wire = torch.zeros(world, config.steps, len(WIRE_FIELDS), dtype=torch.int64)
    buckets = 0
    # Validation before the first step too: the curve then starts at the
    # untrained loss (about ln 256 = 5.55 nats per byte).
    val_losses: list[tuple[int, float]] = [(0, evaluate(model, corpus, config, rank, world))]
    for step in range(config.steps):
        wire.start()  # evaluation's collectives are not the step's
        start = time.perf_counter()
        # The batch is a function of (seed, rank, step) alone.
        inputs, targets = data.train_batch(corpus.train, config.batch_size, config.context, config.seed, rank, step)
        optimizer.zero_grad(set_to_none=True)
        loss = lm_loss(ddp(inputs), targets)
        loss.backward()  # DDP all-reduces gradients through the hook here
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), GRAD_CLIP)
        optimizer.step()
        local_loss[step] = loss.item()
        elapsed = time.perf_counter() - start
        comm = timer.take()
        buckets = comm.buckets
        local_times[rank, step] = torch.tensor([elapsed, comm.busy_s, comm.exposed_s], dtype=torch.float64)
        local_wire[rank, step] = torch.tensor(wire.take(), dtype=torch.int64)
        done = step + 1
        if done == config.steps or (config.eval_every and done % config.eval_every == 0):
            val = evaluate(model, corpus, config, rank, world)
            val_losses.append((done, val))
            if on_progress:
                print(
                    f"step {done}/{config.steps}  train {local_loss[step].item():.4f} (rank 0)  val {val:.4f}  "
                    f"step {elapsed:.3f} s, exposed comm {comm.exposed_s:.3f} s (rank 0)",
                    flush=True,
                )

    # A few collectives for all per-step figures at the end, not some per
    # step: per-step ones would add communication that the hook timer does not
    # see. Each rank fills its own row of the zeroed tables; the sum gathers them.
    dist.all_reduce(local_loss)
    dist.all_reduce(local_times)
    dist.all_reduce(local_wire)
    train_loss = (local_loss / world).tolist()
    skip = warmup_steps(config.steps)
    timed = config.steps - skip
    # Sums over the timed steps, then the mean over ranks.
    step_sum, busy_sum, exposed_sum = local_times[:, skip:].sum(dim=1).mean(dim=0).tolist()
    times = local_times.tolist()
    wire_rows = local_wire.tolist()
    return TrainResult(
        world_size=world,
        hook_impl=choice.impl,
        parameters=parameter_count(model),
        corpus=corpus.describe(),
        train_loss=train_loss,
        val_loss=val_losses,
        step_time_s=[row[0] for row in times[0]],
        comm_time_s=[row[1] for row in times[0]],
        buckets_per_step=buckets,
        timed_steps=timed,
        tokens_per_s=config.tokens_per_step(world) * timed / step_sum if step_sum > 0 else 0.0,
        comm_share=busy_sum / step_sum if step_sum > 0 else 0.0,
        step_time_by_rank_s=[[row[0] for row in ranked] for ranked in times],
        exposed_comm_s=[[row[2] for row in ranked] for ranked in times],
        wire_bytes={
            field: [[row[i] for row in ranked] for ranked in wire_rows] for i, field in enumerate(WIRE_FIELDS)
        },
        wire_counted=wire.counted,
        gradient_bytes=4 * sum(p.numel() for p in model.parameters() if p.requires_grad),
        exposed_comm_share=exposed_sum / step_sum if step_sum > 0 else 0.0,
        heap_kept=heap_kept,
    )


@torch.no_grad()
def evaluate(model: CharTransformer, corpus: data.Corpus, config: TrainConfig, rank: int, world: int) -> float:
    """Mean validation loss over the fixed windows, each rank taking a share. Collective."""
    # The bare module, not DDP: no gradients, so nothing for DDP to synchronize.
    model.eval()
    inputs, targets = data.val_batch(corpus.val, config.val_windows, config.context, rank, world)
    total = torch.zeros(2, dtype=torch.float64)  # (sum of token losses, tokens)
    if inputs.numel():  # more ranks than windows leaves some with none
        total[0] = lm_loss(model(inputs), targets).item() * targets.numel()
        total[1] = targets.numel()
    model.train()
    dist.all_reduce(total)
    return (total[0] / total[1]).item()


def _check_same_corpus(corpus: data.Corpus) -> None:
    """Ranks on hosts with different Pythons read different stdlibs; refuse rather than train on a mix."""
    tag = int(corpus.sha256[:15], 16)  # 60 bits: fits int64 with room for the sign
    spread = torch.tensor([tag, -tag], dtype=torch.int64)
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    if spread[0].item() != -spread[1].item():
        raise RuntimeError(
            "ranks read different standard libraries (different Python versions on the hosts?); "
            f"this rank's corpus sha256 is {corpus.sha256[:12]}"
        )
