"""What each rank runs: build data and model, train under DDP, evaluate, summarize."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from pycomm.train import checkpoint, data, recovery
from pycomm.train.config import TrainConfig
from pycomm.train.faults import FaultPlan
from pycomm.train.hooks import CommTimer, choose_hook
from pycomm.train.memory import keep_freed_memory
from pycomm.train.model import CharTransformer, lm_loss, parameter_count
from pycomm.train.residuals import ResidualLayout
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
    resumed_from_step: int | None = None  # steps the checkpoint this run resumed from had done
    lost_ranks: list[int] = dataclasses.field(default_factory=list)  # --on-failure shrink: starting ranks lost


def warmup_steps(steps: int) -> int:
    # The first step pays one-off costs (allocations, DDP's lazy setup) that
    # would skew throughput at tens of steps; it is left out of the figures.
    return 1 if steps > 1 else 0


@dataclasses.dataclass
class _Tables:
    """Per-step figures, one row per rank: each rank fills its own row, a sum gathers them.

    Per rank (not only rank 0) so that a checkpoint holds every rank's rows, and each rank of a
    resumed run takes its own back.
    """

    loss: torch.Tensor  # [world, steps] float64: each step's (mean micro-batch) loss
    times: torch.Tensor  # [world, steps, 3] float64: wall time, comm busy time, exposed comm time
    wire: torch.Tensor  # [world, steps, len(WIRE_FIELDS)] int64: bytes, see wire.py

    @classmethod
    def zeros(cls, world: int, steps: int) -> _Tables:
        return cls(
            torch.zeros(world, steps, dtype=torch.float64),
            torch.zeros(world, steps, 3, dtype=torch.float64),
            torch.zeros(world, steps, len(WIRE_FIELDS), dtype=torch.int64),
        )

    def gathered(self) -> _Tables:
        """Every rank's rows on every rank (a copy). Collective."""
        copies = _Tables(self.loss.clone(), self.times.clone(), self.wire.clone())
        for table in (copies.loss, copies.times, copies.wire):
            dist.all_reduce(table)
        return copies


@dataclasses.dataclass
class _Run:
    """One rank's training state: what a step changes and what a checkpoint holds."""

    config: TrainConfig
    rank: int  # in the group as it is now (a shrink renumbers it)
    world: int
    corpus: data.Corpus
    model: CharTransformer
    ddp: DistributedDataParallel
    optimizer: torch.optim.Optimizer
    hook_state: Any
    residuals: ResidualLayout | None
    fault: FaultPlan | None
    tables: _Tables
    val_losses: list[tuple[int, float]]
    # The rank this process started as: its batches, its rows of the tables and the fault plan's
    # rank stay its own after a shrink.
    data_rank: int = 0
    shrinks: list[recovery.Shrunk] = dataclasses.field(default_factory=list)
    failure_seen: float = 0.0  # perf_counter() when the last failure was caught here
    members: list[int] = dataclasses.field(default_factory=list)  # starting ranks of the group now
    lost: list[int] = dataclasses.field(default_factory=list)  # starting ranks lost, in order


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
    timer = CommTimer()
    residuals = ResidualLayout(list(model.parameters())) if config.error_feedback else None
    ddp, choice = _wrap(model, config, timer, residuals)
    # fused=None is torch's default (a per-parameter loop on CPU): the small
    # model's results predate the option and stay as they were.
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=config.lr, fused=True if config.fused_adamw else None)
    wire = WireCounter()
    run = _Run(
        config, rank, world, corpus, model, ddp, optimizer, choice.state, residuals, FaultPlan.of(config),
        _Tables.zeros(world, config.steps), [], data_rank=rank, members=list(range(world)),
    )
    start = 0
    if config.resume_path is not None:
        start = _resume(run, on_progress)
        _lay_out_buckets(run)
        timer.take()  # its all-reduce is no step's
    else:
        # Validation before the first step too: the curve then starts at the
        # untrained loss (about ln 256 = 5.55 nats per byte).
        run.val_losses.append((0, evaluate(model, corpus, config, rank, world)))
    buckets = 0
    step = start
    while step < config.steps:
        wire.start()  # evaluation's and checkpoints' collectives are not the step's
        began = time.perf_counter()
        try:
            loss = _optimizer_step(run, step)
        except RuntimeError as error:
            # A lost rank makes the step's all-reduce raise here (and on every survivor).
            if config.on_failure != "shrink":
                raise
            step = _carry_on_without_lost(run, error, step, timer, on_progress)
            continue
        elapsed = time.perf_counter() - began
        comm = timer.take()
        buckets = comm.buckets
        run.tables.loss[rank, step] = loss
        run.tables.times[rank, step] = torch.tensor([elapsed, comm.busy_s, comm.exposed_s], dtype=torch.float64)
        run.tables.wire[rank, step] = torch.tensor(wire.take(), dtype=torch.int64)
        done = step + 1
        step = done
        if run.shrinks and run.shrinks[-1].next_step == done - 1 and on_progress and dist.get_rank() == 0:
            print(f"first step on the shrunk group done {time.perf_counter() - run.failure_seen:.3f} s after the "
                  "failure was caught", flush=True)
        if done == config.steps or (config.eval_every and done % config.eval_every == 0):
            val = evaluate(model, corpus, config, run.rank, run.world)
            run.val_losses.append((done, val))
            if on_progress:
                print(
                    f"step {done}/{config.steps}  train {loss:.4f} (rank 0)  val {val:.4f}  "
                    f"step {elapsed:.3f} s, exposed comm {comm.exposed_s:.3f} s (rank 0)",
                    flush=True,
                )
        if config.checkpoint_dir is not None and (
            done == config.steps or (config.checkpoint_every and done % config.checkpoint_every == 0)
        ):
            _write_checkpoint(run, done, on_progress)

    # A few collectives for all per-step figures at the end, not some per
    # step: per-step ones would add communication that the hook timer does not
    # see. Each rank fills its own rows of the zeroed tables; the sum gathers them.
    tables = run.tables.gathered()
    # The mean over the ranks that ran each step (after a shrink, the lost ranks' rows are gone).
    ran = (tables.loss != 0).sum(dim=0).clamp(min=1)
    train_loss = (tables.loss.sum(dim=0) / ran).tolist()
    world = run.world
    skip = warmup_steps(config.steps)
    timed = config.steps - skip
    # Sums over the timed steps, then the mean over ranks.
    # Over the ranks still there (after a shrink, a lost rank's row stops at its loss).
    step_sum, busy_sum, exposed_sum = tables.times[run.members, skip:].sum(dim=1).mean(dim=0).tolist()
    times = tables.times.tolist()
    wire_rows = tables.wire.tolist()
    first = run.members[0]  # the lowest starting rank still there: its row is "rank 0's"
    return TrainResult(
        world_size=world,
        hook_impl=choice.impl,
        parameters=parameter_count(model),
        corpus=corpus.describe(),
        train_loss=train_loss,
        val_loss=run.val_losses,
        step_time_s=[row[0] for row in times[first]],
        comm_time_s=[row[1] for row in times[first]],
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
        resumed_from_step=start if config.resume_path is not None else None,
        lost_ranks=run.lost,
    )


def _optimizer_step(run: _Run, step: int) -> float:
    """One optimizer step (0-based ``step``): accum_steps micro-batches, one gradient all-reduce.

    DDP's no_sync() on all micro-batches but the last: their gradients accumulate locally, and
    the last one's backward all-reduces the sum, once. Returns the mean micro-batch loss.
    """
    config, accum = run.config, run.config.accum_steps
    run.optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for micro in range(accum):
        # The batch is a function of (seed, rank, micro-batch index) alone; with one
        # micro-batch per step that index is the step, as it was before accumulation.
        inputs, targets = data.train_batch(
            run.corpus.train, config.batch_size, config.context, config.seed, run.data_rank, step * accum + micro
        )
        last = micro == accum - 1
        with contextlib.nullcontext() if last else run.ddp.no_sync():
            loss = lm_loss(run.ddp(inputs), targets)
            if last and run.fault is not None:
                run.fault.maybe_fire(run.data_rank, step + 1)  # the peers are about to wait in this all-reduce
            # Scaled so that the accumulated gradient is the mean over micro-batches;
            # not at all with one, so such a run is bit for bit what it was before.
            (loss if accum == 1 else loss / accum).backward()  # the last one all-reduces (through the hook)
        total += loss.item()
    torch.nn.utils.clip_grad_norm_(run.ddp.parameters(), GRAD_CLIP)
    run.optimizer.step()
    return total / accum


def _wrap(
    model: CharTransformer, config: TrainConfig, timer: CommTimer, residuals: ResidualLayout | None
) -> tuple[DistributedDataParallel, Any]:
    """DDP around ``model`` on the default group, with the run's comm hook timed by ``timer``."""
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
    choice = choose_hook(config.hook, config.error_feedback)
    hook = residuals.wrap(choice.hook) if residuals is not None else choice.hook
    ddp.register_comm_hook(choice.state, timer.wrap(hook))
    return ddp, choice


def _carry_on_without_lost(run: _Run, error: RuntimeError, step: int, timer: CommTimer, on_progress: bool) -> int:
    """--on-failure shrink (recovery.py): shrink, agree on the state, rebuild DDP; returns the step to run."""
    run.failure_seen = time.perf_counter()
    shrunk = recovery.shrink_and_agree(error, run.model, run.optimizer, step)
    before = run.world
    run.lost += [run.members[r] for r in shrunk.lost]
    run.members = [m for r, m in enumerate(run.members) if r not in shrunk.lost]
    run.rank, run.world = shrunk.rank, shrunk.world
    run.ddp, choice = _wrap(run.model, run.config, timer, run.residuals)
    run.hook_state = choice.state
    timer.take()  # the failed step's communication is no step's
    run.shrinks.append(shrunk)
    if on_progress or shrunk.rank == 0:
        print(
            f"step {step + 1}: lost rank(s) {run.lost} of {before} ({recovery.one_line(error)}); shrunk to "
            f"{shrunk.world} ranks in {shrunk.seconds:.3f} s, going on from step {shrunk.next_step + 1}; the global "
            f"batch is now {shrunk.world} x {run.config.batch_size} sequences",
            flush=True,
        )
    return shrunk.next_step



def _lay_out_buckets(run: _Run) -> None:
    """Make DDP lay out its buckets as the interrupted run had them, before the first resumed step.

    DDP buckets the gradients one way for the first step, then lays them out again, once, by
    the order in which the first backward produced them. The layout decides which rank reduces
    which elements, the blocks a codec scales together and where each error-feedback residual
    sits, so a resumed run whose first step used the initial layout would not reproduce the
    uninterrupted run's numbers. One forward and backward records that order (its all-reduce
    makes this collective); nothing it computes is kept: the next step clears the gradients,
    and the hook's residuals are set aside meanwhile.
    """
    config = run.config
    inputs, targets = data.train_batch(run.corpus.train, config.batch_size, config.context, config.seed, run.rank, 0)
    aside = run.residuals.set_aside(run.hook_state) if run.residuals is not None else contextlib.nullcontext()
    with aside:
        lm_loss(run.ddp(inputs), targets).backward()
    run.optimizer.zero_grad(set_to_none=True)


def _write_checkpoint(run: _Run, done: int, on_progress: bool) -> None:
    """Every rank's share of a checkpoint after ``done`` steps; rank 0 writes it. Collective."""
    began = time.perf_counter()
    tables = run.tables.gathered()  # rank 0 needs every rank's rows
    residuals = _gathered_residuals(run)  # and every rank's residuals, each rank's its own
    if run.rank != 0:
        return
    state = {
        "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "rng": checkpoint.rng_states(),
        "data": {"micro_batches": done * run.config.accum_steps},
        "residuals": residuals,
        "history": {
            "loss": tables.loss[:, :done],
            "times": tables.times[:, :done],
            "wire": tables.wire[:, :done],
            "val_loss": [[step, loss] for step, loss in run.val_losses],
        },
    }
    path = checkpoint.save(run.config.checkpoint_dir or "", checkpoint.Header.of_run(run.config, run.world, done), state)
    if on_progress:
        print(f"checkpoint {path} after step {done} ({time.perf_counter() - began:.3f} s)", flush=True)


def _gathered_residuals(run: _Run) -> torch.Tensor | None:
    """Every rank's error-feedback residuals, [world, parameters] (all of them, flat); None without. Collective.

    Each rank's residuals are its own (what its encoding dropped), so each rank's are saved.
    """
    if run.residuals is None:
        return None
    pieces = run.residuals.by_parameter(run.hook_state.residuals)
    flat = torch.cat(
        [pieces.get(i, torch.zeros(p.numel())).reshape(-1) for i, p in enumerate(run.model.parameters())]
    ).to(torch.float32)
    rows = [torch.empty_like(flat) for _ in range(run.world)]
    dist.all_gather(rows, flat)
    return torch.stack(rows)


def _resume(run: _Run, on_progress: bool) -> int:
    """Load the checkpoint the CLI chose into this rank's state; returns the steps it had done."""
    config = run.config
    latest = checkpoint.find_latest(config.checkpoint_dir or "")
    if latest is None or latest.path != config.resume_path:
        raise checkpoint.CheckpointError(f"{config.checkpoint_dir} changed since the run started: no {config.resume_path}")
    state = checkpoint.load(latest)
    done = latest.header.step
    # Ranks that read different checkpoints (a directory not shared between hosts) must not train on.
    spread = torch.tensor([done, -done], dtype=torch.int64)
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    if spread[0].item() != -spread[1].item():
        raise checkpoint.CheckpointError(
            f"ranks resume from different steps ({-spread[1].item()} to {spread[0].item()}): "
            "is the checkpoint directory shared by every host?"
        )
    if state["data"]["micro_batches"] != done * config.accum_steps:
        raise checkpoint.CheckpointError(f"checkpoint {latest.path}: data position disagrees with its step")
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    checkpoint.restore_rng_states(state["rng"])
    if run.residuals is not None:
        # This rank's row, cut back into its parameters' slices.
        row = state["residuals"][run.rank]
        sizes = [p.numel() for p in run.model.parameters()]
        run.residuals.restore(dict(enumerate(row.split(sizes))))
    history = state["history"]
    rank = run.rank
    run.tables.loss[rank, :done] = history["loss"][rank]
    run.tables.times[rank, :done] = history["times"][rank]
    run.tables.wire[rank, :done] = history["wire"][rank]
    run.val_losses[:] = [(int(step), float(loss)) for step, loss in history["val_loss"]]
    if on_progress:
        print(f"resuming from {latest.path}: step {done} of {config.steps} done", flush=True)
    return done


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
