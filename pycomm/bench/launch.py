"""Where the ranks come from: forked locally, or already there (torchrun)."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from datetime import timedelta

from pycomm.bench.config import BenchConfig
from pycomm.bench.runner import EXIT_FAIL, run_rank, spawn_entry
from pycomm.ranks import fork_ranks, report_silent_deaths, terminate_ranks, under_torchrun, wait_ranks


def run_existing_rank(config: BenchConfig) -> int:
    """This process is one rank of a launcher-provided job (any hosts)."""
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    code, message = run_rank(rank, world, local_world, config)
    if message:
        print(f"pycomm.bench: error: rank {rank}: {message}", file=sys.stderr, flush=True)
    return code


def run(config: BenchConfig, nproc: int) -> int:
    """The ranks of a launcher if one started us, else ``nproc`` forked here."""
    if under_torchrun():
        return run_existing_rank(config)
    return run_local(config, nproc)


def run_local(config: BenchConfig, nproc: int) -> int:
    """Start ``nproc`` ranks on this host (forked: pycomm.ranks.fork_ranks) and wait for them.

    The launcher serves the rendezvous TCPStore itself on an OS-chosen port:
    nothing to race for, and it outlives any single rank.
    """
    import torch.distributed as dist  # deferred: keeps `--help` fast

    results = mp.get_context("fork").Queue()
    procs, _store = fork_ranks(
        nproc, spawn_entry, (nproc, config, results), config.timeout_s,
        lambda: dist.TCPStore(  # type: ignore[attr-defined]
            "127.0.0.1", 0, nproc, is_master=True, timeout=timedelta(seconds=config.timeout_s), wait_for_workers=False
        ),
    )
    try:
        wait_ranks(procs)
    except KeyboardInterrupt:
        terminate_ranks(procs)
        return 130
    messages: dict[int, str | None] = {}
    while not results.empty():
        rank, _code, message = results.get()
        messages[rank] = message
    codes = [proc.exitcode for proc in procs]
    report_silent_deaths("pycomm.bench", codes, messages)
    # Then one line per distinct problem: ranks usually fail for one reason.
    seen: set[str] = set()
    for rank in sorted(messages):
        message = messages[rank]
        if message and message not in seen:
            seen.add(message)
            print(f"pycomm.bench: error: {message}", file=sys.stderr, flush=True)
    if all(code == 0 for code in codes):
        return 0
    rank0 = codes[0]
    return rank0 if rank0 is not None and rank0 > 0 else EXIT_FAIL
