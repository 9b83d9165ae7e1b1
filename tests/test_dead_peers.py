"""Dead peers: a rank SIGKILLed mid-loop or mid-receive fails the others promptly, naming it, and
they shut down cleanly; a rank killed during the shared-memory setup leaves nothing in /dev/shm.

Measured figures are printed with the ``[reliability]`` prefix (run with ``-s``); see
docs/RELIABILITY.md. Ranks run under cluster.Cluster, or mp.run_ranks where only their results matter.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from cluster import DESTROY_MAX_S, EXIT_MAX_S, Cluster, Control, error_info, report, shm_pycomm_files
from stalling_store import stall_pycomm_store


# A rank is SIGKILLed mid-loop: the others fail promptly, naming it, and shut down cleanly.

DEAD_PEER_PG_TIMEOUT_S = 5.0
DEAD_PEER_DETECT_MAX_S = 7.0


def _allreduce_loop_worker(rank: int, world: int, ctl: Control, numel: int) -> dict[str, Any]:
    t = torch.empty(numel, dtype=torch.float32)
    expected = float(sum(r + 1 for r in range(world)))
    wrong = iterations = 0
    error = None
    start = time.monotonic()
    try:
        while time.monotonic() - start < 60.0:  # bounded even if nobody dies
            t.fill_(rank + 1)
            dist.all_reduce(t)
            if t[0].item() != expected or t[-1].item() != expected:
                wrong += 1
            iterations += 1
            if iterations == 5:
                ctl.event("looping", os.getpid())
    except Exception as exc:  # noqa: BLE001  (the test checks the type)
        error = error_info(exc)
    t0 = time.monotonic()
    dist.destroy_process_group()
    return {
        "error": error,
        "wrong": wrong,
        "iterations": iterations,
        "destroy_s": time.monotonic() - t0,
    }


def _recv_from_doomed_worker(rank: int, world: int, ctl: Control) -> dict[str, Any]:
    doomed = world - 1
    if rank == doomed:
        ctl.event("looping", os.getpid())
        time.sleep(120)  # never sends; killed by the test
        return {}
    t = torch.zeros(4096)
    error = None
    ctl.event("looping", os.getpid())
    try:
        dist.recv(t, src=doomed)
    except Exception as exc:  # noqa: BLE001
        error = error_info(exc)
    t0 = time.monotonic()
    dist.destroy_process_group()
    return {"error": error, "wrong": 0, "iterations": 0, "destroy_s": time.monotonic() - t0}


@pytest.mark.parametrize(
    "pattern,transport",
    [("all_reduce_loop", "tcp"), ("all_reduce_loop", "auto"), ("recv", "tcp")],
)
def test_sigkill_peer_fails_survivors_promptly(pycomm: ModuleType, pattern: str, transport: str) -> None:
    """transport auto: the all-reduces run over shared memory (all ranks share this host)."""
    world, doomed = 3, 2
    shm_before = shm_pycomm_files()
    fn, args = (
        (_allreduce_loop_worker, (256 * 1024,))  # 1 MiB of float32
        if pattern == "all_reduce_loop"
        else (_recv_from_doomed_worker, ())
    )
    with Cluster(
        fn,
        world,
        args=args,
        env={"PYCOMM_TRANSPORT": transport},
        pg_timeout_s=DEAD_PEER_PG_TIMEOUT_S,
        hang_timeout_s=90,
    ) as c:
        killed_at, survivors = c.kill_in_loop(doomed)  # 0.3 s on: well inside the loop / the blocking recv
        results = {r: c.result(r, timeout=DEAD_PEER_DETECT_MAX_S + DESTROY_MAX_S + 20) for r in survivors}
        exits = {r: c.wait_exit(r, timeout=EXIT_MAX_S) for r in survivors}
        logs = {r: c.stderr(r) for r in survivors}

    problems = []
    for rank, res in results.items():
        err = res["error"]
        if res["wrong"]:
            problems.append(f"rank {rank}: {res['wrong']} wrong all_reduce results before the kill")
        if err is None:
            problems.append(f"rank {rank}: no error after peer {doomed} was killed")
            continue
        detect_s = err["at"] - killed_at
        report(
            f"dead peer ({pattern}, transport {transport}, world {world}, timeout "
            f"{DEAD_PEER_PG_TIMEOUT_S}s): rank {rank} "
            f"raised {err['type']} {detect_s * 1000:.1f} ms after SIGKILL of rank {doomed}; "
            f"destroy_process_group took {res['destroy_s'] * 1000:.1f} ms; "
            f"message: {err['message'][:200]!r}"
        )
        if not err["runtime_error"]:
            problems.append(f"rank {rank}: raised {err['type']}, not a RuntimeError")
        if detect_s > DEAD_PEER_DETECT_MAX_S:
            problems.append(f"rank {rank}: error came {detect_s:.1f}s after the kill")
        names_dead = re.search(rf"\bpeer {doomed}\b", err["message"]) is not None
        relayed = re.search(r"peer \d+ reported a failure", err["message"]) is not None
        if not (names_dead or relayed):
            problems.append(
                f"rank {rank}: message names neither peer {doomed} nor a relayed failure: "
                f"{err['message']!r}"
            )
        if res["destroy_s"] > DESTROY_MAX_S:
            problems.append(f"rank {rank}: destroy_process_group took {res['destroy_s']:.1f}s")
        code, waited = exits[rank]
        if code != 0:
            problems.append(
                f"rank {rank}: exit code {code} after {waited:.1f}s (None: still running)\n"
                f"{logs[rank][-3000:]}"
            )
    leaked = shm_pycomm_files() - shm_before
    if leaked:
        problems.append(f"files left in /dev/shm: {sorted(leaked)}")
    assert not problems, "\n".join(problems)


def _hold_rank_1_before_host_list(rank: int) -> None:
    _hold_before_host_list(rank, 1)


def _hold_rank_0_before_host_list(rank: int) -> None:
    _hold_before_host_list(rank, 0)


def _hold_before_host_list(rank: int, held: int) -> None:
    """Runs before init_process_group on every rank; rank `held` stalls before it reads the host list."""
    if rank == held:
        stall_pycomm_store("pycomm/host/0", stall_s=6.0)


def _never_reached_worker(rank: int, world: int, ctl: Control) -> None:
    ctl.event("formed")


@pytest.mark.parametrize("held", [1, 0])
@pytest.mark.parametrize("victim", ["creator", "joiner"])
def test_sigkill_during_shared_memory_setup_leaves_nothing_in_dev_shm(
    pycomm: ModuleType, victim: str, held: int
) -> None:
    """The rank that is not held creates the segment and waits in the vote for the held one; one of
    them is killed then. Held rank 1: the creator's death takes the store, and rank 1 never learns
    its host index. Held rank 0 (the store's process): the creator dies with its segment created,
    and rank 0 comes later to find it, opens it and must remove it."""
    shm_before = shm_pycomm_files()
    with Cluster(
        _never_reached_worker,
        2,
        env={"PYCOMM_TRANSPORT": "auto"},
        pg_timeout_s=DEAD_PEER_PG_TIMEOUT_S,
        hang_timeout_s=90,
        before_init=_hold_rank_1_before_host_list if held == 1 else _hold_rank_0_before_host_list,
    ) as c:
        deadline = time.monotonic() + 60
        while not (shm_pycomm_files() - shm_before):
            assert time.monotonic() < deadline, "no shared-memory segment appeared in /dev/shm"
            if not all(p.is_alive() for p in c.procs):
                c._fail("a rank exited before a segment appeared in /dev/shm")
            time.sleep(0.02)
        segment = shm_pycomm_files() - shm_before
        doomed = 1 - held if victim == "creator" else held
        survivor = 1 - doomed
        c.kill(doomed)
        code, waited = c.wait_exit(survivor, timeout=DEAD_PEER_PG_TIMEOUT_S + 20)
        log = c.stderr(survivor)
    leaked = shm_pycomm_files() - shm_before
    for path in leaked:  # do not leave our own mess behind, whatever the verdict
        with contextlib.suppress(OSError):
            os.unlink(path)
    report(
        f"SIGKILL of the {victim} during shared-memory setup (rank {held} held): segment {sorted(segment)}; survivor "
        f"exited with {code} after {waited:.1f}s; left in /dev/shm: {sorted(leaked)}"
    )
    assert code is not None, f"the survivor (rank {survivor}) did not exit:\n{log[-3000:]}"
    assert not leaked, f"left in /dev/shm after the {victim} was killed: {sorted(leaked)}"
