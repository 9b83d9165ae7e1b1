"""Collectives on tensors autograd or inference mode guards: what gloo accepts, pycomm must too.

A non-contiguous leaf that requires grad (a channels_last parameter) and tensors made under
torch.inference_mode() are written in place by the op; the write must not go through autograd's
checks, on whichever thread finishes the op. Values are checked against a float64 reference.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from mp import run_ranks

TIMEOUT_S = 120
WORLD = 3
REL_TOL = 1e-6  # float32 results of AVG against the float64 reference, relative to the value


def _data(rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randint(-50, 50, shape, generator=g).double()  # integers: exact float32 sums


def _modes_worker(rank: int, world: int, strided_recv: bool) -> list[str]:
    import torch.distributed as dist

    failures: list[str] = []

    def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        diff = (got.detach().double() - want).abs() - REL_TOL * want.abs().clamp(min=1.0)
        err = float(diff.max()) if got.numel() else 0.0
        if got.shape != want.shape or not err <= 0.0:
            failures.append(f"rank {rank} {name}: max error {err}")

    # A channels_last convolution weight: a leaf Parameter, not contiguous.
    conv = torch.nn.Conv2d(4, 8, 3).to(memory_format=torch.channels_last)
    with torch.no_grad():
        conv.weight.copy_(_data(rank, tuple(conv.weight.shape)))
    assert not conv.weight.is_contiguous() and conv.weight.requires_grad
    dist.broadcast(conv.weight, src=1)
    check("broadcast channels_last parameter", conv.weight, _data(1, tuple(conv.weight.shape)))
    work = dist.all_reduce(conv.weight, async_op=True)
    work.wait()
    check("async all_reduce channels_last parameter", conv.weight, world * _data(1, tuple(conv.weight.shape)))

    leaf = _data(rank, (5, 7)).float().t().requires_grad_()
    dist.all_reduce(leaf)
    check("all_reduce transposed leaf", leaf, sum(_data(r, (5, 7)) for r in range(world)).t())

    ref_sum = sum(_data(r, (6, 11)) for r in range(world))
    with torch.inference_mode():
        t = _data(rank, (6, 11)).float()
        dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True).wait()
        check("inference async all_reduce AVG", t, ref_sum / world)

        out = torch.empty(2, 11)
        dist.reduce_scatter_tensor(out, _data(rank, (6, 11)).float(), op=dist.ReduceOp.AVG)
        check("inference reduce_scatter_tensor AVG", out, (ref_sum / world)[2 * rank : 2 * rank + 2])

        outs = [torch.zeros(13, 2)[:, 0] for _ in range(world)]
        dist.all_gather(outs, _data(rank, (13,)).float())
        for r in range(world):
            check(f"inference all_gather into strided output {r}", outs[r], _data(r, (13,)))

        right, left = (rank + 1) % world, (rank - 1) % world
        recv_into = torch.zeros(9, 3)[:, 1] if strided_recv else torch.zeros(9)
        reqs = dist.batch_isend_irecv(
            [
                dist.P2POp(dist.isend, _data(rank, (9,)).float(), right),
                dist.P2POp(dist.irecv, recv_into, left),
            ]
        )
        for req in reqs:
            req.wait()
        check("inference irecv", recv_into, _data(left, (9,)))
    return failures


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_autograd_leaves_and_inference_tensors(pycomm: ModuleType, transport: str) -> None:
    results = run_ranks(
        _modes_worker,
        WORLD,
        backend="pycomm",
        timeout_s=TIMEOUT_S,
        pg_timeout_s=30,
        pg_options=pycomm.Options(transport=transport),
        args=(True,),
    )
    failures = [f for per_rank in results for f in per_rank]
    assert not failures, "\n".join(failures)


def test_gloo_agrees() -> None:
    # The same program on gloo (torch's CPU backend): these are things a backend is expected to do.
    # gloo refuses to receive into a non-contiguous tensor; pycomm receives and copies back.
    results = run_ranks(
        _modes_worker, WORLD, backend="gloo", timeout_s=TIMEOUT_S, args=(False,)
    )
    failures = [f for per_rank in results for f in per_rank]
    assert not failures, "\n".join(failures)
