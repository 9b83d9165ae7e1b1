"""Rendezvous methods, sub-groups and teardown."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from reference import check_equal, check_reduced, input_for
from support import Failures, assert_no_failures

TIMEOUT_S = 90


def _init_worker(rank: int, world: int, backend: str) -> tuple[list[str], int]:
    f = Failures(rank)
    f.check(
        "get_backend",
        None
        if dist.get_backend() == backend
        else f"get_backend() = {dist.get_backend()!r}",
    )
    f.check(
        "get_rank/get_world_size",
        None
        if (dist.get_rank(), dist.get_world_size()) == (rank, world)
        else "wrong rank/world size",
    )
    inputs = [input_for(1, r, (4099,), torch.float32, "sum") for r in range(world)]
    t = inputs[rank].clone()
    with f.guard("all_reduce"):
        dist.all_reduce(t)
        f.check("all_reduce", check_reduced(t, inputs, "sum"))
    with f.guard("barrier"):
        dist.barrier()
    return f.result()


@pytest.mark.parametrize("init", ["env", "tcp", "file"])
def test_init_methods(backend: str, init: str) -> None:
    results = run_ranks(
        _init_worker,
        3,
        backend=backend,
        init=init,
        timeout_s=TIMEOUT_S,
        args=(backend,),
    )
    assert_no_failures(results)


def _subset_worker(rank: int, world: int) -> tuple[list[str], int]:
    assert world == 4
    f = Failures(rank)
    # Every rank must call new_group for every group, in the same order.
    g02 = dist.new_group([0, 2])  # non-contiguous membership
    g123 = dist.new_group([1, 2, 3])
    g01 = dist.new_group([0, 1])
    g23 = dist.new_group([2, 3])

    if rank in (0, 2):
        members = [0, 2]
        f.check(
            "g02 rank",
            None
            if dist.get_rank(g02) == members.index(rank)
            else f"rank {dist.get_rank(g02)}",
        )
        f.check("g02 size", None if dist.get_world_size(g02) == 2 else "wrong size")
        inputs = [input_for(10, r, (13,), torch.float64, "sum") for r in members]
        t = inputs[members.index(rank)].clone()
        with f.guard("g02 all_reduce"):
            dist.all_reduce(t, group=g02)
            f.check("g02 all_reduce", check_reduced(t, inputs, "sum"))
    else:
        f.check(
            "non-member rank",
            None if dist.get_rank(g02) == -1 else "non-member has a group rank",
        )

    if rank in (1, 2, 3):
        members = [1, 2, 3]
        data = [input_for(11, r, (4099,), torch.int32, None) for r in members]
        t = data[members.index(rank)].clone()
        with f.guard("g123 broadcast src=3 (global)"):
            dist.broadcast(t, src=3, group=g123)
            f.check("g123 broadcast", check_equal(t, data[2]))
        with f.guard("g123 all_gather"):
            outs = [torch.empty(4099, dtype=torch.int32) for _ in members]
            dist.all_gather(outs, data[members.index(rank)], group=g123)
            for k in range(3):  # ordered by group rank
                f.check(f"g123 all_gather[{k}]", check_equal(outs[k], data[k]))

    # Two disjoint groups running at the same time, then the whole world.
    pair = [0, 1] if rank < 2 else [2, 3]
    inputs = [input_for(12, r, (1 << 18,), torch.float32, "sum") for r in pair]
    t = inputs[pair.index(rank)].clone()
    with f.guard("concurrent disjoint groups"):
        work = dist.all_reduce(t, group=g01 if rank < 2 else g23, async_op=True)
        world_inputs = [
            input_for(13, r, (7,), torch.float32, "sum") for r in range(world)
        ]
        w = world_inputs[rank].clone()
        dist.all_reduce(w)
        work.wait()
        f.check("pair all_reduce", check_reduced(t, inputs, "sum"))
        f.check("world all_reduce", check_reduced(w, world_inputs, "sum"))

    with f.guard("destroy subgroup"):
        dist.destroy_process_group(g02)
        dist.barrier()  # the default group must survive destroying a subgroup
    return f.result()


def _subgroups_worker(rank: int, world: int) -> tuple[list[str], int]:
    f = Failures(rank)
    # group_size must be given on CPU: its default is torch.cuda.device_count().
    cur, _ = dist.new_subgroups(group_size=2)
    members = [rank // 2 * 2, rank // 2 * 2 + 1]
    inputs = [input_for(20, r, (4099,), torch.float32, "sum") for r in members]
    t = inputs[members.index(rank)].clone()
    with f.guard("new_subgroups all_reduce"):
        dist.all_reduce(t, group=cur)
        f.check("new_subgroups all_reduce", check_reduced(t, inputs, "sum"))

    cur, _ = dist.new_subgroups_by_enumeration([[0, 3], [1, 2]])
    members = [0, 3] if rank in (0, 3) else [1, 2]
    inputs = [input_for(21, r, (13,), torch.int64, "max") for r in members]
    t = inputs[members.index(rank)].clone()
    with f.guard("new_subgroups_by_enumeration all_reduce max"):
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=cur)
        f.check(
            "new_subgroups_by_enumeration all_reduce max",
            check_reduced(t, inputs, "max"),
        )
    # Ranks 0 and 3 are done with their pair before 1 and 2 may have set theirs up through the
    # store, which lives in rank 0's process: nobody leaves until everyone is done with it.
    dist.barrier()
    return f.result()


@pytest.mark.parametrize("worker", [_subset_worker, _subgroups_worker], ids=["new_group_subsets", "new_subgroups"])
def test_subgroups(backend: str, worker: Callable[[int, int], tuple[list[str], int]]) -> None:
    assert_no_failures(run_ranks(worker, 4, backend=backend, timeout_s=TIMEOUT_S))


def _diverged_names_worker(rank: int, world: int) -> tuple[list[str], int]:
    f = Failures(rank)
    # torch 2.14's shrink_group advances torch's group counter on the ranks that shrink only, so a
    # rank the shrink left out, and that stays, names every later new_group differently from the
    # others, and torch gives each rank's backend the store under another prefix. Done here by
    # hand, on any torch: the groups must form all the same (gloo and NCCL wait for the timeout).
    if rank == 1:
        dist.distributed_c10d._world.group_count += 1
    for case, members in enumerate((list(range(world)), [0, 2], list(range(world)))):
        with f.guard(f"group {case} of ranks {members}"):
            group = dist.new_group(members, timeout=timedelta(seconds=15))
            if rank not in members:
                continue
            t = torch.full((3,), float(rank + 1))
            dist.all_reduce(t, group=group)
            expected = torch.full((3,), float(sum(r + 1 for r in members)))
            f.check(f"all_reduce in group {case}", None if torch.equal(t, expected) else f"{t}")
    dist.barrier()
    return f.result()


def test_groups_form_when_torch_names_them_differently() -> None:
    assert_no_failures(run_ranks(_diverged_names_worker, 3, backend="pycomm", timeout_s=TIMEOUT_S))


def _destroy_worker(rank: int, world: int) -> float:
    sub = dist.new_group([0, 1])
    t = torch.ones(1 << 16)
    dist.all_reduce(t)
    if rank < 2:
        dist.all_reduce(t, group=sub)
    # Stagger: early ranks destroy while later ones are still working.
    time.sleep(0.3 * rank)
    start = time.monotonic()
    dist.destroy_process_group()
    elapsed = time.monotonic() - start
    assert not dist.is_initialized()
    return elapsed


def test_destroy_process_group_is_prompt(backend: str) -> None:
    # run_ranks also fails if a rank does not exit after returning.
    times = run_ranks(_destroy_worker, 3, backend=backend, timeout_s=TIMEOUT_S)
    slow = {rank: round(t, 2) for rank, t in enumerate(times) if t >= 5.0}
    assert not slow, f"destroy_process_group took >= 5 s on ranks {slow}"


def _early_exit_worker(rank: int, world: int) -> tuple[list[str], int]:
    """Rank 0 finishes its one-sided part and destroys its group at once; the others lag.

    Legal under torch.distributed semantics (no barrier is required before
    destroy_process_group): rank 0's sends and its non-root reduce are complete
    once its data is handed over, and the later ops among the remaining ranks
    do not involve it at all. gloo passes this.
    """
    f = Failures(rank)
    g12 = dist.new_group([1, 2])  # collective over all ranks, before rank 0 leaves
    n = 1 << 20  # 4 MiB of float32: more than the socket buffers hold
    inputs = [input_for(31, r, (n,), torch.float32, "sum") for r in range(world)]
    message = input_for(32, 0, (n,), torch.float32, None)
    t = inputs[rank].clone()
    if rank == 0:
        dist.reduce(t, dst=1)
        dist.send(message, dst=1)
        dist.destroy_process_group()
        f.check("rank 0 done", None)
        return f.result()
    time.sleep(1.0)  # let rank 0 leave first
    with f.guard("reduce (dst=1) after rank 0 destroyed its group"):
        dist.reduce(t, dst=1)
        if rank == 1:
            f.check("reduce", check_reduced(t, inputs, "sum"))
    if rank == 1:
        with f.guard("recv from rank 0 after it destroyed its group"):
            got = torch.empty(n)
            dist.recv(got, src=0)
            f.check("recv", check_equal(got, message))
    members = [1, 2]
    small = [input_for(33, r, (4099,), torch.float64, "sum") for r in members]
    s = small[members.index(rank)].clone()
    with f.guard("all_reduce among ranks 1, 2 after rank 0 left"):
        dist.all_reduce(s, group=g12)
        f.check("all_reduce among ranks 1, 2", check_reduced(s, small, "sum"))
    return f.result()


def test_peer_destroying_early_does_not_break_others(backend: str) -> None:
    assert_no_failures(
        run_ranks(_early_exit_worker, 3, backend=backend, timeout_s=TIMEOUT_S)
    )
