"""What a group formed from another inherits (config.h: Lineage): a subgroup of a pycomm default group
derives its secret from the default group's and exchanges its ranks' host ids over its own
connections, so that it writes and reads only its members' addresses in the store, and still forms,
with shared memory, and computes right."""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from reference import check_equal, check_reduced, input_for
from support import Failures, assert_no_failures, formation_keys

TIMEOUT_S = 120


def _check_group(f: Failures, name: str, group: dist.ProcessGroup, members: list[int], seed: int) -> None:
    """all_reduce (exact on int64, float64 reference on float32) and all_to_all over the rings."""
    import pycomm

    rank = dist.get_rank()
    me = members.index(rank)
    n = len(members)
    for dtype, count in ((torch.int64, 4099), (torch.float32, 1)):
        inputs = [input_for(seed, members[q], (count,), dtype, "sum") for q in range(n)]
        t = inputs[me].clone()
        with f.guard(f"{name} all_reduce {dtype}"):
            dist.all_reduce(t, group=group)
            f.check(f"{name} all_reduce {dtype}", check_reduced(t, inputs, "sum"))
    before = pycomm.stats(group)["transport/shm_ring"]["bytes_sent"]
    out = torch.empty(5 * n, dtype=torch.int64)
    with f.guard(f"{name} all_to_all"):
        dist.all_to_all_single(out, torch.arange(5 * n, dtype=torch.int64) + 1000 * rank, group=group)
        expected = torch.tensor([1000 * members[q] + 5 * me + i for q in range(n) for i in range(5)])
        f.check(f"{name} all_to_all", check_equal(out, expected))
    sent = pycomm.stats(group)["transport/shm_ring"]["bytes_sent"] - before
    f.check(f"{name} shared memory", None if sent > 0 else "the all_to_all sent nothing through shared memory")


def _lineage_worker(rank: int, world: int, child_transport: str) -> tuple[list[str], int]:
    import pycomm

    f = Failures(rank)
    options = pycomm.Options(transport=child_transport)
    everyone = list(range(world))
    pair = [0, world - 1]
    # Two groups of the same members back to back: each has a secret (and segment names) of its own.
    first = dist.new_group(everyone, backend="pycomm", pg_options=options)
    second = dist.new_group(everyone, backend="pycomm", pg_options=options)
    ends = dist.new_group(pair, backend="pycomm", pg_options=options)
    for round_ in range(2):
        _check_group(f, f"first group, round {round_}", first, everyone, 10 + round_)
        _check_group(f, f"second group, round {round_}", second, everyone, 20 + round_)
        if rank in pair:
            _check_group(f, f"pair, round {round_}", ends, pair, 30 + round_)
    dist.barrier()
    if rank == 0:
        # Only the subgroups' keys: the default group's own (token, host ids) are under torch's names.
        read = formation_keys("pycomm/group/")
        stray = [k for k in read if not re.fullmatch(r"pycomm/addr/\d+", k)]
        f.check("subgroup store keys", None if read and not stray else f"subgroups wrote {read}")
    dist.barrier()
    return f.result()


@pytest.mark.parametrize(("parent_transport", "world"), [("auto", 3), ("tcp", 4)])
def test_subgroups_inherit_their_secret_and_read_only_addresses(parent_transport: str, world: int) -> None:
    results = run_ranks(_lineage_worker, world, backend="pycomm", timeout_s=TIMEOUT_S,
                        env={"PYCOMM_TRANSPORT": parent_transport}, args=("auto",))
    assert_no_failures(results)


def _chunk_disagreement_worker(rank: int, world: int) -> dict[str, object]:
    import pycomm

    # chunk_bytes cuts shared-memory steps, where no signature tells a step cut differently: ranks
    # that disagree on it must all go to their connections (the setup vote sees every rank's),
    # whose frames carry their lengths, so that a schedule cut differently fails there clearly.
    group = dist.new_group(list(range(world)), pg_options=pycomm.Options(chunk_bytes=65536 * (rank + 1)))
    out = torch.empty(3 * world, dtype=torch.int64)
    dist.all_to_all_single(out, torch.arange(3 * world, dtype=torch.int64) + 100 * rank, group=group)
    expected = torch.tensor([100 * q + 3 * rank + i for q in range(world) for i in range(3)])
    result: dict[str, object] = {"all_to_all": check_equal(out, expected),
                                 "shm_ring_bytes": pycomm.stats(group)["transport/shm_ring"]["bytes_sent"]}
    try:
        dist.all_reduce(torch.ones(70_001, dtype=torch.int64), group=group)
        result["all_reduce"] = "completed"
    except RuntimeError as error:
        result["all_reduce"] = str(error)
    return result


def test_ranks_that_disagree_on_chunk_bytes_use_their_connections() -> None:
    results = run_ranks(_chunk_disagreement_worker, 3, backend="pycomm", timeout_s=TIMEOUT_S,
                        env={"PYCOMM_TRANSPORT": "auto"}, destroy=False)
    assert all(r["all_to_all"] is None and r["shm_ring_bytes"] == 0 for r in results), results
    assert any("mismatched sizes" in str(r["all_reduce"]) for r in results), results
