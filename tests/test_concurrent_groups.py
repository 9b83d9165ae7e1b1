"""Eight process groups over the same ranks, used at once from eight threads per rank, over
shared memory and over TCP, every result exact.

Measured figures are printed with the ``[reliability]`` prefix (run with ``-s``); see
docs/RELIABILITY.md. Ranks run under cluster.Cluster, or mp.run_ranks where only their results matter.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from cluster import TRANSPORTS, report
from mp import run_ranks


# Eight process groups over the same ranks, used at once from eight threads per rank.

CONCURRENT_GROUPS = 8
CONCURRENT_ITERS = 50


def _threads_worker(rank: int, world: int, n_groups: int, iters: int) -> dict[str, Any]:
    import pycomm

    groups = [dist.new_group(backend="pycomm") for _ in range(n_groups)]
    start_line = threading.Barrier(n_groups)
    errors: list[str] = []
    checked = [0] * n_groups
    elapsed = [0.0] * n_groups

    def run(g: int) -> None:
        rng = random.Random(1000 + g)  # same sizes on every rank
        try:
            start_line.wait(timeout=60)
            t0 = time.monotonic()
            for i in range(iters):
                n = rng.choice((1, 3, 1000, 4097, 65_537, 200_003))
                base = torch.arange(n, dtype=torch.int64)
                # distinct per group, step and rank; sums are exact in int64
                t = base * (g + 1) + (rank + 1) * 1_000_003 + i * 7_919 + g * 104_729
                dist.all_reduce(t, group=groups[g])
                expected = (
                    base * (g + 1) * world
                    + sum(r + 1 for r in range(world)) * 1_000_003
                    + world * (i * 7_919 + g * 104_729)
                )
                if not torch.equal(t, expected):
                    bad = int((t != expected).sum())
                    errors.append(f"group {g} step {i}: {bad} of {n} elements wrong")
                checked[g] += 1
            elapsed[g] = time.monotonic() - t0
        except Exception as exc:  # noqa: BLE001
            errors.append(f"group {g}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=run, args=(g,), name=f"group{g}") for g in range(n_groups)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=240)
    stuck = [th.name for th in threads if th.is_alive()]
    if stuck:
        errors.append(f"threads still running after 240 s: {stuck}")
        faulthandler.dump_traceback(all_threads=True)
        sys.stderr.flush()
        os._exit(3)  # hung threads would keep the process alive; run_ranks reports the exit
    calls = [int(pycomm.stats(group=grp).get("allreduce", {}).get("calls", 0)) for grp in groups]
    t = torch.ones(8, dtype=torch.int64)
    dist.all_reduce(t)  # the default group is untouched by all this
    if t.tolist() != [world] * 8:
        errors.append(f"default group all_reduce after the threads: {t.tolist()}")
    for grp in groups:
        dist.destroy_process_group(grp)
    return {"errors": errors, "checked": checked, "calls": calls, "elapsed": elapsed}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_eight_groups_from_eight_threads(pycomm: ModuleType, transport: str) -> None:
    world = 3
    results = run_ranks(
        _threads_worker,
        world,
        backend="pycomm",
        timeout_s=300,
        pg_timeout_s=60,
        args=(CONCURRENT_GROUPS, CONCURRENT_ITERS),
        env={"PYCOMM_TRANSPORT": transport},
    )
    problems = [f"rank {r}: {e}" for r, res in enumerate(results) for e in res["errors"]]
    for r, res in enumerate(results):
        if res["checked"] != [CONCURRENT_ITERS] * CONCURRENT_GROUPS:
            problems.append(f"rank {r}: checked per group {res['checked']}")
        if res["calls"] != [CONCURRENT_ITERS] * CONCURRENT_GROUPS:
            problems.append(f"rank {r}: pycomm.stats allreduce calls per group {res['calls']}")
    report(
        f"{CONCURRENT_GROUPS} groups x {CONCURRENT_ITERS} all_reduces from {CONCURRENT_GROUPS} "
        f"threads, world {world}, transport {transport}: slowest thread "
        f"{max(max(res['elapsed']) for res in results):.1f}s"
    )
    assert not problems, "\n".join(problems[:40])
