"""Sparse COO all-reduce (SUM, CPU), as gloo offers it: DDP with sparse embedding gradients uses it.

Each rank makes its own random sparse tensor (nnz differing from rank to rank, none on one rank,
duplicate indices before coalescing); the result must equal the float64 sum of every rank's dense
form (integers exactly). Tensors with no entries on any rank sum to an empty tensor. DDP with nn.Embedding(sparse=True) is checked against a single process
training on the concatenated batch, as in test_ddp_fsdp.py.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from mp import run_ranks
from torch import nn

TIMEOUT_S = 120
REL_TOL = 1e-6  # float32 sums against the float64 reference


def _sparse_input(
    seed: int, rank: int, shape: tuple[int, ...], sparse_dim: int, dtype: torch.dtype
) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seed + rank)
    nnz = 0 if rank == 1 else int(torch.randint(1, 40, (1,), generator=g))
    indices = torch.stack(
        [torch.randint(0, shape[d], (nnz,), generator=g) for d in range(sparse_dim)]
    )
    values = torch.randint(-20, 20, (nnz, *shape[sparse_dim:]), generator=g).to(dtype)
    return torch.sparse_coo_tensor(indices, values, shape)  # not coalesced: duplicates possible


CASES = (
    ((50,), 1, torch.float32),
    ((13, 7), 2, torch.float64),
    ((11, 6), 1, torch.float32),  # hybrid: one sparse dim, a dense row per entry
    ((9, 4, 3), 2, torch.int64),
)


def _sparse_worker(rank: int, world: int) -> list[str]:
    import torch.distributed as dist

    problems: list[str] = []
    for seed, (shape, sparse_dim, dtype) in enumerate(CASES):
        inputs = [_sparse_input(seed, r, shape, sparse_dim, dtype) for r in range(world)]
        t = inputs[rank].clone()
        work = dist.all_reduce(t, async_op=(seed % 2 == 1))
        if work is not None:
            value = work.get_future().wait()[0]
            if not value.is_sparse:
                problems.append(f"case {seed}: future value is not sparse")
        want = sum(x.to_dense().double() for x in inputs)
        got = t.to_dense().double()
        err = (got - want).abs() - REL_TOL * want.abs().clamp(min=1.0)
        if not t.is_sparse or got.shape != want.shape or (got.numel() and float(err.max()) > 0):
            problems.append(f"case {seed} {shape} {dtype}: wrong sum")

    # No entries on any rank: the sum is an empty sparse tensor of the same shape.
    for shape, sparse_dim in (((5,), 1), ((4, 3), 2), ((6, 2), 1)):
        empty = torch.sparse_coo_tensor(
            torch.zeros((sparse_dim, 0), dtype=torch.long), torch.zeros((0, *shape[sparse_dim:])), shape
        )
        dist.all_reduce(empty)
        if not empty.is_sparse or empty.shape != shape or empty._nnz() != 0:
            problems.append(f"all ranks empty {shape}: got {empty}")

    # Mismatched shapes fail on every rank, and the group is still usable.
    bad = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (5 + rank,))
    try:
        dist.all_reduce(bad)
        if world > 1:
            problems.append("mismatched shapes were accepted")
    except (ValueError, RuntimeError) as error:
        if "differs" not in str(error):
            problems.append(f"mismatched shapes: unclear error {error}")
    # An index outside the shape on one rank (a tensor made without torch's invariant check) fails
    # every rank, naming that rank, before any rank builds a tensor from it; no tensor changes.
    culprit = world - 1
    for wrong in (5, -1):
        index = torch.tensor([[wrong if rank == culprit else rank % 5]])
        outside = torch.sparse_coo_tensor(index, torch.tensor([1.0]), (5,), check_invariants=False)
        try:
            dist.all_reduce(outside)
            problems.append(f"index {wrong} outside the shape (5,) on rank {culprit} was accepted")
        except (ValueError, RuntimeError) as error:
            if f"rank {culprit}" not in str(error) or "outside" not in str(error):
                problems.append(f"index {wrong} outside the shape: unclear error {error}")
        if not torch.equal(outside._indices(), index) or not torch.equal(outside._values(), torch.tensor([1.0])):
            problems.append(f"index {wrong} outside the shape: the tensor changed to {outside}")
    try:
        dist.all_reduce(inputs[rank].clone(), op=dist.ReduceOp.MAX)
        problems.append("sparse MAX was accepted")
    except ValueError as error:
        if "SUM" not in str(error):
            problems.append(f"sparse MAX: unclear error {error}")
    ok = torch.ones(3)
    dist.all_reduce(ok)
    if not torch.equal(ok, torch.full((3,), float(world))):
        problems.append("the group is not usable after the errors")
    return problems


@pytest.mark.parametrize("world", [1, 3, 4])
def test_sparse_all_reduce(pycomm: ModuleType, world: int) -> None:
    results = run_ranks(
        _sparse_worker, world, backend="pycomm", timeout_s=TIMEOUT_S, pg_timeout_s=30
    )
    problems = [p for per_rank in results for p in per_rank]
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- DDP, sparse embedding
WORLD = 3
BATCH = 6
VOCAB, DIM, CLASSES, STEPS = 40, 8, 5, 8


def _model() -> nn.Module:
    torch.manual_seed(7)
    return nn.Sequential(nn.Embedding(VOCAB, DIM, sparse=True), nn.Flatten(), nn.Linear(3 * DIM, CLASSES))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randint(0, VOCAB, (BATCH, 3), generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)


def _train(model: nn.Module, data: object) -> dict[str, torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(STEPS):
        x, y = data(step)  # type: ignore[operator]
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    inner = getattr(model, "module", model)
    return {k: v.detach().clone() for k, v in inner.state_dict().items()}


def _ddp_worker(rank: int, world: int) -> dict[str, torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    return _train(DDP(_model()), lambda s: _batch(s, rank))


def _reference() -> dict[str, torch.Tensor]:
    def full(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [_batch(step, r) for r in range(WORLD)]
        return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])

    return _train(_model(), full)


def test_ddp_sparse_embedding(pycomm: ModuleType) -> None:
    results = run_ranks(_ddp_worker, WORLD, backend="pycomm", timeout_s=TIMEOUT_S, pg_timeout_s=30)
    for rank in range(1, WORLD):
        for k in results[0]:
            assert torch.equal(results[0][k], results[rank][k]), f"rank {rank} differs in {k}"
    reference = _reference()
    for k, v in reference.items():
        diff = float((results[0][k].double() - v.double()).abs().max())
        assert diff <= 1e-5, f"{k}: {diff} from the single-process reference"
    gloo = run_ranks(_ddp_worker, WORLD, backend="gloo", timeout_s=TIMEOUT_S)
    for k in results[0]:
        diff = float((results[0][k].double() - gloo[0][k].double()).abs().max())
        assert diff <= 1e-6, f"{k}: {diff} from gloo"
