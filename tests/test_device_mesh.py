"""DeviceMesh programs on pycomm: tensor parallel x FSDP2 and HSDP training against gloo and a
single-process reference, and meshes that do not fit the group.

The model is a one-block transformer (vocabulary-sharded embedding, multi-head attention and an
MLP split column- then row-wise, a column-wise head gathered to full logits), so the tensor
parallel plan issues all-reduces and all-gathers on "tp" while FSDP2 all-gathers and
reduce-scatters on "dp". Every data-parallel rank trains on its own fixed batch and the loss is a
mean, so the mean of the data-parallel ranks' losses equals one process training on the
concatenated batches: the backend-independent reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from conftest import load_pycomm
from mp import run_ranks
from reference import check_reduced, input_for
from support import problem_notes
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

WORLD = 4
MESH = (2, 2)
VOCAB = 24
DIM = 16
HEAD_DIM = 8  # DIM // HEAD_DIM = 2 heads: one per tensor-parallel rank
HIDDEN = 32
SEQ = 6
BATCH = 4
STEPS = 20
TIMEOUT_S = 90
# Same program, same data, same reduction order inside each rank: only the backends' summation
# order of the gradient reductions differs.
GLOO_TOL = 1e-5
# One process sums the whole batch at once, the ranks sum per rank and then across ranks.
REFERENCE_TOL = 1e-5

Losses = list[float]  # one rank's loss at each step


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(DIM, DIM, bias=False)
        self.k = nn.Linear(DIM, DIM, bias=False)
        self.v = nn.Linear(DIM, DIM, bias=False)
        self.o = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            # -1: under tensor parallelism this rank holds only its own heads' columns.
            return t.view(batch, seq, -1, HEAD_DIM).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), is_causal=True)
        return self.o(out.transpose(1, 2).reshape(batch, seq, -1))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.attn = Attention()
        self.fc1 = nn.Linear(DIM, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm(x))
        return x + self.fc2(F.gelu(self.fc1(x)))


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.block = Block()
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.tok(tokens)))


def _model() -> TinyTransformer:
    torch.manual_seed(4321)  # same initial weights in every process
    return TinyTransformer()


def _batch(step: int, data_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences that follow t -> (5 t + 3) mod VOCAB from a random start: learnable, so the
    loss falls and a wrong gradient shows."""
    g = torch.Generator().manual_seed(1000 * step + data_rank)
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
    steps = [start]
    for _ in range(SEQ):
        steps.append((5 * steps[-1] + 3) % VOCAB)
    tokens = torch.cat(steps, dim=1)
    return tokens[:, :-1], tokens[:, 1:]


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, data: Callable[[int], tuple[torch.Tensor, torch.Tensor]]) -> Losses:
    losses = []
    for step in range(STEPS):
        tokens, targets = data(step)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(tokens).reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.5)


def _adam(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=0.02)


def _reference(optimizer: Callable[[nn.Module], torch.optim.Optimizer], data_ranks: int) -> Losses:
    """One process, the data-parallel ranks' batches concatenated."""

    def full_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [_batch(step, r) for r in range(data_ranks)]
        return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])

    model = _model()
    return _train(model, optimizer(model), full_batch)


# ---------------------------------------------------------------- the ranks' programs
def _mesh(names: tuple[str, str], backend: str) -> DeviceMesh:
    """A (2, 2) mesh whose groups are the default group's backend (pycomm), or gloo's."""
    from torch.distributed.device_mesh import init_device_mesh

    override: dict[int | str, Any] | None = None if backend == "pycomm" else dict.fromkeys(names, backend)
    mesh = init_device_mesh("cpu", MESH, mesh_dim_names=names, backend_override=override)
    used = {dist.get_backend(mesh.get_group(name)) for name in names}
    assert used == {backend}, f"the mesh's groups run {used}, not {backend}"
    return mesh


def _tp_fsdp(backend: str) -> Losses:
    """Tensor parallel on "tp", FSDP2 on "dp"; the "tp" peers train on the same batch."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = _mesh(("dp", "tp"), backend)
    model = _model()
    parallelize_module(
        model,
        mesh["tp"],
        {
            "tok": RowwiseParallel(input_layouts=Replicate()),  # vocabulary rows split
            "block.attn.q": ColwiseParallel(),
            "block.attn.k": ColwiseParallel(),
            "block.attn.v": ColwiseParallel(),
            "block.attn.o": RowwiseParallel(),
            "block.fc1": ColwiseParallel(),
            "block.fc2": RowwiseParallel(),
            "head": ColwiseParallel(output_layouts=Replicate()),
        },
    )
    fully_shard(model.block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    data_rank = mesh["dp"].get_local_rank()
    return _train(model, _sgd(model), lambda step: _batch(step, data_rank))


def _hsdp(backend: str) -> Losses:
    """fully_shard over (replicate, shard): every rank is a data rank."""
    from torch.distributed.fsdp import fully_shard

    mesh = _mesh(("replicate", "shard"), backend)
    model = _model()
    fully_shard(model.block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return _train(model, _adam(model), lambda step: _batch(step, dist.get_rank()))


PROGRAMS = {"tp_fsdp": _tp_fsdp, "hsdp": _hsdp}
Runs = dict[tuple[str, str], Losses]  # (program, backend) -> this rank's losses


def _programs_worker(rank: int, world: int) -> Runs:
    # Both backends in one process per rank: importing FSDP and DTensor costs each rank
    # ~2 s of CPU, paid once. The default group is pycomm; gloo runs on groups of its own.
    return {(name, backend): program(backend) for name, program in PROGRAMS.items() for backend in ("pycomm", "gloo")}


@pytest.fixture(scope="module")
def runs() -> list[Runs]:
    load_pycomm()  # the suite's import policy (conftest); a module-scoped fixture cannot use `pycomm`
    return run_ranks(_programs_worker, WORLD, backend="pycomm", timeout_s=TIMEOUT_S)


def _max_abs_diff(a: Losses, b: Losses) -> float:
    assert len(a) == len(b) == STEPS, f"{len(a)} and {len(b)} losses, expected {STEPS}"
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def _check(runs: list[Runs], program: str, data_rank_of: Callable[[int], int], reference: Losses) -> None:
    # The reference must be able to tell a broken run: its loss falls clearly.
    assert reference[-1] < 0.5 * reference[0], f"reference loss hardly moves: {reference}"
    pycomm = [r[program, "pycomm"] for r in runs]
    gloo = [r[program, "gloo"] for r in runs]
    for rank in range(WORLD):
        diff = _max_abs_diff(pycomm[rank], gloo[rank])
        assert diff <= GLOO_TOL, f"rank {rank}: pycomm and gloo losses differ by {diff}:\n{pycomm[rank]}\n{gloo[rank]}"
    first_of = {data_rank_of(rank): rank for rank in reversed(range(WORLD))}
    for rank in range(WORLD):
        # Ranks on one batch (tensor-parallel peers) hold the same gathered logits: equal bits.
        assert pycomm[rank] == pycomm[first_of[data_rank_of(rank)]], f"rank {rank} and its peers' losses differ"
    mean = [sum(pycomm[r][step] for r in first_of.values()) / len(first_of) for step in range(STEPS)]
    diff = _max_abs_diff(mean, reference)
    assert diff <= REFERENCE_TOL, f"pycomm's mean loss and the reference differ by {diff}:\n{mean}\n{reference}"


def test_tensor_parallel_with_fsdp2(runs: list[Runs]) -> None:
    _check(runs, "tp_fsdp", lambda rank: rank // MESH[1], _reference(_sgd, data_ranks=MESH[0]))


def test_hsdp(runs: list[Runs]) -> None:
    _check(runs, "hsdp", lambda rank: rank, _reference(_adam, data_ranks=WORLD))


# ---------------------------------------------------------------- meshes that do not fit
# (shape, dim names, what torch's error says). Each is refused before any group is made.
BAD_MESHES = [
    ((2, 4), None, "Mesh should not be bigger than default world size 4, but found 8 ranks"),
    ((4,), ("dp", "tp"), "mesh_shape and mesh_dim_names should have same length"),
    ((2, 2), ("dp", "dp"), "Each mesh_dim_name must be unique"),
]


def _all_reduce_problem(seed: int, group: dist.ProcessGroup | None, ranks: list[int]) -> str | None:
    """None if an all-reduce over ``group`` (holding ``ranks``) gives the float64 sum."""
    inputs = [input_for(seed, r, (1031,), torch.float32, "sum") for r in ranks]
    t = inputs[ranks.index(dist.get_rank())].clone()
    dist.all_reduce(t, group=group)
    return check_reduced(t, inputs, "sum")


def _bad_meshes_worker(rank: int, world: int) -> list[str]:
    from torch.distributed.device_mesh import init_device_mesh

    problems, note = problem_notes()
    everyone = list(range(world))
    for seed, (shape, names, message) in enumerate(BAD_MESHES):
        what = f"mesh {shape} names {names}"
        try:
            init_device_mesh("cpu", shape, mesh_dim_names=names)
            note(what, "accepted")
        except RuntimeError as error:
            note(what, None if message in str(error) else f"raised {error!r}, not {message!r}")
        note(f"default group after {what}", _all_reduce_problem(seed, None, everyone))
    # A mesh smaller than the group is no error in torch 2.13: a sub-mesh of the first 3 ranks,
    # the last rank outside it (no coordinate).
    mesh = init_device_mesh("cpu", (3,))
    inside = rank < 3
    coordinate = mesh.get_coordinate()
    found = None if coordinate is None else tuple(coordinate)
    expected = (rank,) if inside else None
    note("coordinate in the (3,) mesh", None if found == expected else f"{found}, expected {expected}")
    if inside:
        note("all-reduce on the (3,) mesh", _all_reduce_problem(10, mesh.get_group(), [0, 1, 2]))
    note("default group after the (3,) mesh", _all_reduce_problem(11, None, everyone))
    return problems


def test_meshes_that_do_not_fit(pycomm: object) -> None:
    per_rank = run_ranks(_bad_meshes_worker, WORLD, backend="pycomm", timeout_s=60)
    failures = [f"rank {rank}: {p}" for rank, problems in enumerate(per_rank) for p in problems]
    assert not failures, "\n".join(failures)
