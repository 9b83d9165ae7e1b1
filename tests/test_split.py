"""Backend::split, the entry torch's split path takes (ProcessGroup.split_group; dist.split_group and
DeviceMesh reach it only for a group bound to a device, which torch 2.13 refuses on CPU, so the entry
is called directly here). World 4 split by parity into {0, 2} and {1, 3}, and a world-3 split into
{0, 2} with rank 1 outside: every subgroup all-reduces and all-gathers exactly, carries the parent's
settings, and names its global ranks in the flight recorder; bad rank lists fail clearly and leave the
parent working."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from support import Failures, assert_no_failures, formation_keys

TIMEOUT_S = 90


def parity_worker(rank: int, world: int) -> tuple[list[str], int]:
    import pycomm

    f = Failures(rank)
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    f.check("supports_splitting", None if backend.supports_splitting else "False")
    members = [r for r in range(world) if r % 2 == rank % 2]
    sub = dist.group.WORLD.split_group(members, timeout=timedelta(seconds=30), group_name=f"parity{rank % 2}")
    f.check("a subgroup", None if sub is not None and sub.size() == len(members) else f"{sub}")
    f.check("its rank", None if sub.rank() == members.index(rank) else f"rank {sub.rank()}")
    for n in (0, 1, 1021):
        t = torch.arange(n, dtype=torch.int64) + rank
        sub.allreduce([t]).wait()
        expected = sum(torch.arange(n, dtype=torch.int64) + r for r in members)
        f.check(f"all_reduce {n} in the subgroup", None if torch.equal(t, torch.as_tensor(expected)) else f"{t[:4]}")
    out = torch.empty(len(members) * 3, dtype=torch.float32)
    sub._allgather_base(out, torch.full((3,), float(rank))).wait()
    expected_gather = torch.cat([torch.full((3,), float(r)) for r in members])
    f.check("all_gather in the subgroup", None if torch.equal(out, expected_gather) else f"{out}")
    child = sub._get_backend(torch.device("cpu"))
    f.check("the child is pycomm", None if isinstance(child, pycomm._C.PycommBackend) else f"{type(child)}")
    dump = pycomm.flight_recorder_entries()
    config = dump["pg_config"].get(f"parity{rank % 2}")
    f.check("the recorder names the global ranks", None if config and config["ranks"] == str(members) else f"{dump['pg_config']}")
    # The parent keeps working beside its child.
    t = torch.ones(2)
    dist.all_reduce(t)
    f.check("the parent after the split", None if torch.equal(t, torch.full((2,), float(world))) else f"{t}")
    # The children took their secret and host ids from the parent (config.h: Lineage): the store
    # carried only their addresses.
    keys = formation_keys("pycomm/split/")
    f.check("the split's store keys", None if keys and all(re.fullmatch(r"pycomm/addr/\d", k) for k in keys) else f"{keys}")
    dist.barrier()  # rank 0 hosts the store: it may not exit while another rank still reads it
    return f.result()


def outside_worker(rank: int, world: int) -> tuple[list[str], int]:
    f = Failures(rank)
    if rank != 1:
        sub = dist.group.WORLD.split_group([2, 0], timeout=timedelta(seconds=30), group_name="ends")
        t = torch.full((5,), float(rank + 1))
        sub.allreduce([t]).wait()
        f.check("all_reduce of ranks 0 and 2", None if torch.equal(t, torch.full((5,), 4.0)) else f"{t}")
    else:
        f.check("rank 1 stays out", None)
    # torch refuses duplicates itself; a rank outside the group reaches the backend.
    for bad, words in (([0, 0, 1], "duplicates"), ([0, 7], "not in this group")):
        with pytest.raises(Exception, match=words):
            dist.group.WORLD.split_group(bad, timeout=timedelta(seconds=5), group_name=f"bad{len(bad)}")
    t = torch.ones(2)
    dist.all_reduce(t)
    f.check("the parent after bad splits", None if torch.equal(t, torch.full((2,), float(world))) else f"{t}")
    return f.result()


@pytest.mark.parametrize(("worker", "world"), [(parity_worker, 4), (outside_worker, 3)],
                         ids=["split_by_parity", "a_rank_outside_and_bad_rank_lists"])
def test_split(worker: Callable[[int, int], tuple[list[str], int]], world: int) -> None:
    assert_no_failures(run_ranks(worker, world, backend="pycomm", timeout_s=TIMEOUT_S))
