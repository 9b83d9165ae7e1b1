"""CUDA tensors through the staged path (pinned host copies on a communication stream).

The device checks run only where torch sees a GPU (benchmarks/gpu_check.sh runs this file there);
every rank uses cuda:0, the case the staged path exists for. Results are compared on the CPU with a
float64 reference. The stream tests make the caller's stream slow (torch.cuda._sleep) right before
an op, so an op that did not wait for the caller's stream reads the old values; and they read a
64 MiB result on a side stream right after wait(), so a wait() that did not order that stream
after the copy back (milliseconds long) would most likely read the old values.

Tensors on other devices never reach the backend (torch answers meta tensors itself, say), so
without a GPU nothing here runs.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from reference import check_equal, check_reduced, input_for
from support import future_tensors, import_pycomm_or_skip, problem_notes, reduce_op

# Short: a hang here costs a scarce GPU session. The group timeout bounds every wait inside.
TIMEOUT_S = 90.0
PG_TIMEOUT_S = 30.0
SIZES = (0, 1, 1021, 65537)
# Enough GPU cycles that the caller's stream is still busy when the op is issued (about 50 ms).
SLEEP_CYCLES = 100_000_000

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _collectives_worker(rank: int, world: int) -> list[str]:
    dev = torch.device("cuda", 0)
    problems, note = problem_notes()

    for n in SIZES:
        for dtype, op in ((torch.float32, "sum"), (torch.float32, "avg"), (torch.float16, "sum"),
                          (torch.int32, "sum"), (torch.int64, "max"), (torch.float64, "min")):
            inputs = [input_for(11 + n, r, (n,), dtype, op) for r in range(world)]
            t = inputs[rank].to(dev)
            dist.all_reduce(t, op=reduce_op(op))
            note(f"all_reduce {dtype} {op} n={n}", check_reduced(t.cpu(), inputs, op))
        inputs = [input_for(23 + n, r, (n,), torch.float32, None) for r in range(world)]
        # Non-contiguous device input: every other element of a longer tensor.
        wide = torch.zeros(2 * n, device=dev)
        wide[::2] = inputs[rank].to(dev)
        strided = wide[::2]
        dist.all_reduce(strided)
        note(f"all_reduce strided n={n}", check_reduced(strided.cpu(), inputs, "sum"))
        note(f"all_reduce strided n={n} gaps", None if bool((wide[1::2] == 0).all()) else "gaps written")

        b = inputs[rank].to(dev)
        dist.broadcast(b, src=world - 1)
        note(f"broadcast n={n}", check_equal(b.cpu(), inputs[world - 1]))

        out = torch.full((n * world,), float("nan"), device=dev)
        dist.all_gather_into_tensor(out, inputs[rank].to(dev))
        note(f"all_gather_into_tensor n={n}", check_equal(out.cpu(), torch.cat(inputs)))

        outs = [torch.full((n,), float("nan"), device=dev) for _ in range(world)]
        dist.all_gather(outs, inputs[rank].to(dev))
        for r in range(world):
            note(f"all_gather n={n} from {r}", check_equal(outs[r].cpu(), inputs[r]))

        full = [input_for(31 + n, r, (n * world,), torch.float32, "sum") for r in range(world)]
        rs = torch.full((n,), float("nan"), device=dev)
        dist.reduce_scatter_tensor(rs, full[rank].to(dev))
        expected_block = [f[rank * n:(rank + 1) * n] for f in full]
        note(f"reduce_scatter_tensor n={n}", check_reduced(rs.cpu(), expected_block, "sum"))

        a2a = torch.full((n * world,), float("nan"), device=dev)
        dist.all_to_all_single(a2a, full[rank].to(dev))
        note(f"all_to_all_single n={n}",
             check_equal(a2a.cpu(), torch.cat([f[rank * n:(rank + 1) * n] for f in full])))

        red = inputs[rank].to(dev)
        dist.reduce(red, dst=0)
        if rank == 0:
            note(f"reduce n={n}", check_reduced(red.cpu(), inputs, "sum"))
        else:
            note(f"reduce n={n} non-root", check_equal(red.cpu(), inputs[rank]))

        # List forms: reduce_scatter, all_to_all, gather, scatter.
        blocks = [f.reshape(world, n) for f in full]  # blocks[r][q]: rank r's block for rank q
        rsl = torch.full((n,), float("nan"), device=dev)
        dist.reduce_scatter(rsl, [b.to(dev) for b in blocks[rank]])
        note(f"reduce_scatter list n={n}", check_reduced(rsl.cpu(), [b[rank] for b in blocks], "sum"))
        a2al = [torch.full((n,), float("nan"), device=dev) for _ in range(world)]
        dist.all_to_all(a2al, [b.to(dev) for b in blocks[rank]])
        for q in range(world):
            note(f"all_to_all list n={n} from {q}", check_equal(a2al[q].cpu(), blocks[q][rank]))
        root = world - 1
        gathered = [torch.full((n,), float("nan"), device=dev) for _ in range(world)] if rank == root else None
        dist.gather(inputs[rank].to(dev), gathered, dst=root)
        if gathered is not None:
            for q in range(world):
                note(f"gather n={n} from {q}", check_equal(gathered[q].cpu(), inputs[q]))
        scattered = torch.full((n,), float("nan"), device=dev)
        dist.scatter(scattered, [b.to(dev) for b in blocks[0]] if rank == 0 else None, src=0)
        note(f"scatter n={n}", check_equal(scattered.cpu(), blocks[0][rank]))

    # The compressed all-reduce runs the CPU codec on the staged copy: bit for bit what the same
    # call gives on CPU tensors.
    import pycomm

    for codec in ("fp16", "bf16", "fp8_e4m3"):
        data = input_for(41, rank, (70001,), torch.float32, "sum")
        on_cpu = data.clone()
        pycomm.all_reduce(on_cpu, compression=codec)
        on_gpu = data.to(dev)
        pycomm.all_reduce(on_gpu, compression=codec)
        note(f"compressed {codec} vs CPU", check_equal(on_gpu.cpu(), on_cpu))

    # Coalesced gathers and reduce-scatters of tensors (the fast paths of the coalescing manager).
    from torch.distributed.distributed_c10d import _coalescing_manager

    ins = [torch.full((k + 2,), float(rank + k), device=dev) for k in range(3)]
    outs = [torch.empty((k + 2) * world, device=dev) for k in range(3)]
    with _coalescing_manager(device=dev, async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    for k, o in enumerate(outs):
        want = torch.cat([torch.full((k + 2,), float(r + k)) for r in range(world)])
        note(f"coalesced all_gather_into_tensor {k}", check_equal(o.cpu(), want))
    rs_in = [torch.full(((k + 2) * world,), float(rank + 1), device=dev) for k in range(3)]
    rs_out = [torch.empty(k + 2, device=dev) for k in range(3)]
    with _coalescing_manager(device=dev, async_ops=True) as cm:
        for o, i in zip(rs_out, rs_in):
            dist.reduce_scatter_tensor(o, i)
    cm.wait()
    for k, o in enumerate(rs_out):
        note(f"coalesced reduce_scatter_tensor {k}", check_equal(o.cpu(), torch.full((k + 2,), world * (world + 1) / 2)))

    # Point to point, alone and batched in a ring (receive first on every rank).
    x = torch.arange(1000, dtype=torch.float32, device=dev) + rank
    if rank == 0:
        dist.send(x, dst=1)
    elif rank == 1:
        got = torch.empty(1000, device=dev)
        dist.recv(got, src=0)
        note("send/recv", check_equal(got.cpu(), torch.arange(1000, dtype=torch.float32)))
    recv_buf = torch.full((777,), -1.0, device=dev)
    ops = [dist.P2POp(dist.irecv, recv_buf, (rank - 1) % world),
           dist.P2POp(dist.isend, torch.full((777,), float(rank), device=dev), (rank + 1) % world)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    note("batch ring", check_equal(recv_buf.cpu(), torch.full((777,), float((rank - 1) % world))))

    # The same ring inside a coalescing block: the block's Work orders the caller's stream after the
    # receive's copy back. The send is a non-contiguous view (every other element).
    ring_in = torch.full((2 * 513,), float(rank + 10), device=dev)
    ring_in[1::2] = -1.0
    ring_out = torch.zeros(513, device=dev)
    with _coalescing_manager(device=dev, async_ops=True) as cm:
        dist.irecv(ring_out, src=(rank - 1) % world)
        dist.isend(ring_in[::2], dst=(rank + 1) % world)
    cm.wait()
    note("coalesced ring", check_equal(ring_out.cpu(), torch.full((513,), float((rank - 1) % world + 10))))

    # A receive from any source into a device tensor says where it came from.
    if rank == 0:
        anywhere = torch.zeros(33, device=dev)
        work = dist.irecv(anywhere)  # no src: from any rank
        work.wait()
        note("recv from any source", check_equal(anywhere.cpu(), torch.full((33,), 5.0)))
        note("recv from any source: source", None if work._source_rank() == world - 1 else
             f"source {work._source_rank()}")
    elif rank == world - 1:
        dist.send(torch.full((33,), 5.0, device=dev), dst=0)

    # Point to point mixed with collectives: a receive posted before an all_reduce the peer issues
    # first must not hold the all_reduce up.
    if rank < 2:
        buf = torch.zeros(100, device=dev)
        if rank == 0:
            work = dist.irecv(buf, src=1)
            s_ = torch.ones(3, device=dev)
            dist.all_reduce(s_)
            work.wait()
            note("irecv across all_reduce", check_equal(buf.cpu(), torch.full((100,), 7.0)))
        else:
            s_ = torch.ones(3, device=dev)
            dist.all_reduce(s_)
            dist.send(torch.full((100,), 7.0, device=dev), dst=0)
    else:
        dist.all_reduce(torch.ones(3, device=dev))

    # A parameter (a leaf that requires grad) broadcast in place, as DDP does at start; and a tensor
    # made in inference mode.
    p = torch.nn.Parameter(torch.full((5,), float(rank + 1), device=dev))
    dist.broadcast(p, src=0)
    note("broadcast parameter", check_equal(p.detach().cpu(), torch.ones(5)))
    note("parameter still a leaf", None if p.is_leaf and p.requires_grad else "autograd state changed")
    with torch.inference_mode():
        inf = torch.ones(9, device=dev)
        dist.all_reduce(inf)
    note("inference-mode tensor", check_equal(inf.cpu(), torch.full((9,), float(world))))

    # A coalesced block: the Work torch returns for it orders the caller's stream after every op.
    block = [torch.full((k + 1,), float(rank + 1), device=dev) for k in range(5)]
    with _coalescing_manager(device=dev, async_ops=True) as cm:
        for x in block:
            dist.all_reduce(x)
    cm.wait()
    total = world * (world + 1) / 2
    for k, x in enumerate(block):
        note(f"coalesced block tensor {k}", check_equal(x.cpu(), torch.full((k + 1,), total)))

    # Tensors of one op on two devices: a clear error on every rank, and the group still works.
    try:
        dist.all_gather([torch.empty(3, device=dev) for _ in range(world)], torch.ones(3))
        problems.append("all_gather from a CPU tensor into CUDA tensors did not raise")
    except ValueError as exc:
        if "must be on one device" not in str(exc) or f"rank {rank}" not in str(exc):
            problems.append(f"unclear message for mixed devices: {exc}")
    t = torch.ones(7, device=dev)
    dist.all_reduce(t)
    note("all_reduce after the refusal", check_equal(t.cpu(), torch.full((7,), float(world))))
    return problems


@needs_gpu
@pytest.mark.parametrize("world", [2, 3])
def test_collectives_on_cuda_tensors(world: int) -> None:
    import_pycomm_or_skip("pytest tests/test_cuda_staged.py")
    for rank, problems in enumerate(run_ranks(_collectives_worker, world, backend="pycomm", timeout_s=TIMEOUT_S, pg_timeout_s=PG_TIMEOUT_S)):
        assert not problems, f"rank {rank}: {problems}"


def _streams_worker(rank: int, world: int) -> dict[str, Any]:
    dev = torch.device("cuda", 0)
    found: dict[str, Any] = {}
    n = 1 << 20
    # 1. The op reads what the caller's stream wrote, even if that is still running at issue.
    t = torch.zeros(n, device=dev)
    torch.cuda._sleep(SLEEP_CYCLES)
    t.fill_(float(rank + 1))
    dist.all_reduce(t)
    found["after_busy_stream"] = float(t.min().item()), float(t.max().item())
    # 2. Two async ops on one tensor, no wait between: the second reads the first's result.
    t = torch.ones(n, device=dev)
    w1 = dist.all_reduce(t, async_op=True)
    w2 = dist.all_reduce(t, async_op=True)
    w2.wait()
    w1.wait()
    found["chained"] = float(t.min().item()), float(t.max().item())
    # 3. wait() orders the caller's stream (here a side stream) after the copies back; 64 MiB, so
    # that the copy back is still running when the host returns from wait().
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        u = torch.full((16 * n,), float(rank), device=dev)
        work = dist.all_reduce(u, async_op=True)
        work.wait()
        doubled = u * 2  # queued on `side`; must see the reduced values
    side.synchronize()
    found["side_stream"] = float(doubled.min().item()), float(doubled.max().item())
    # 4. The future is device-aware: its value is the device tensor, usable once waited.
    v = torch.full((n,), 1.0, device=dev)
    fut = dist.all_reduce(v, async_op=True).get_future()
    value = fut.wait()[0]
    found["future"] = (value.device.type, value.data_ptr() == v.data_ptr(), float(value.sum().item()))
    chained = fut.then(lambda f: f.value()[0] * 3).wait()
    found["then"] = float(chained.min().item())
    # 5. The futures of other ops say the same.
    gathered = torch.empty(n * world, device=dev)
    work = dist.all_gather_into_tensor(gathered, torch.full((n,), float(rank), device=dev), async_op=True)
    found["gather_future"] = [float(x.sum().item()) for x in future_tensors(work)]
    # 6. A synchronous op issued from a future callback runs there and then, on pycomm's worker: it
    # must still order the caller's stream after its copies back (64 MiB) before returning, as
    # wait() does; a synchronous op that returned no Work would skip that.
    def nested(_: torch.futures.Future[Any]) -> tuple[float, float]:
        w = torch.full((16 * n,), float(rank), device=dev)
        dist.all_reduce(w)
        doubled_w = w * 2  # queued on the current stream: must see the reduced values
        return float(doubled_w.min().item()), float(doubled_w.max().item())

    found["nested_sync"] = dist.all_reduce(torch.ones(1), async_op=True).get_future().then(nested).wait()
    return found


@needs_gpu
def test_stream_semantics() -> None:
    import_pycomm_or_skip("pytest tests/test_cuda_staged.py")
    world = 2
    n = 1 << 20
    for rank, found in enumerate(run_ranks(_streams_worker, world, backend="pycomm", timeout_s=TIMEOUT_S, pg_timeout_s=PG_TIMEOUT_S)):
        total = world * (world + 1) / 2
        assert found["after_busy_stream"] == (total, total), (rank, found)
        assert found["chained"] == (world * world, world * world), (rank, found)
        ranks_sum = world * (world - 1) / 2
        assert found["side_stream"] == (2 * ranks_sum, 2 * ranks_sum), (rank, found)
        assert found["future"] == ("cuda", True, float(world * n)), (rank, found)
        assert found["then"] == 3.0 * world, (rank, found)
        assert found["gather_future"] == [float(n * ranks_sum)], (rank, found)
        assert found["nested_sync"] == (2 * ranks_sum, 2 * ranks_sum), (rank, found)


DDP_STEPS = 3


def _ddp_batch(step: int, rank: int, world: int) -> torch.Tensor:
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(100 + step * world + rank))


def _ddp_worker(rank: int, world: int) -> dict[str, torch.Tensor]:
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(DDP_STEPS):
        loss = ddp(_ddp_batch(step, rank, world).to(dev)).square().sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


@needs_gpu
def test_ddp_on_cuda_matches_single_process_reference() -> None:
    import_pycomm_or_skip("pytest tests/test_cuda_staged.py")
    world = 2
    results = run_ranks(_ddp_worker, world, backend="pycomm", timeout_s=TIMEOUT_S, pg_timeout_s=PG_TIMEOUT_S)
    # Reference: one float64 process averaging the ranks' gradients, as DDP does.
    torch.manual_seed(0)
    reference = torch.nn.Linear(16, 4).double()
    for step in range(DDP_STEPS):
        grads = []
        for r in range(world):
            reference.zero_grad()
            reference(_ddp_batch(step, r, world).double()).square().sum().backward()
            grads.append([p.grad.clone() for p in reference.parameters()])
        with torch.no_grad():
            for i, p in enumerate(reference.parameters()):
                p -= 0.1 * sum(g[i] for g in grads) / world
    expected = {k: v.float() for k, v in reference.state_dict().items()}
    for rank, state in enumerate(results):
        for name, value in state.items():
            assert torch.allclose(value, expected[name], rtol=1e-4, atol=1e-5), (rank, name, value, expected[name])
