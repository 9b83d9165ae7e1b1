"""Where the ranks come from: forked on this host, or already there (torchrun)."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import signal
import sys
import time
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist

from pycomm.ranks import GRACE_S, fork_ranks, report_silent_deaths, terminate_ranks, under_torchrun, wait_ranks
from pycomm.train.config import EXIT_FAIL, EXIT_OK, TrainConfig

TRACEBACK_ENV = "PYCOMM_TRAIN_TRACEBACK"  # =1: print full tracebacks, not one line


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 400 else text[:397] + "..."


def run_rank(
    config: TrainConfig, rank: int, join: Callable[[datetime.timedelta], None]
) -> tuple[int, str | None, list[int]]:
    """Join the process group, train, and (rank 0) report. Returns (exit code, one-line error or None,
    the starting ranks the run lost and went on without: --on-failure shrink)."""
    # One intra-op thread per rank: ranks share the host's cores (2 on CI),
    # and a full pool in each would oversubscribe them and make timing noise.
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=config.timeout_s)
    try:
        # No `import pycomm` needed for the backend: it is this package's
        # parent, so importing pycomm.train has registered "pycomm" already.
        join(timeout)
    except Exception as exc:  # noqa: BLE001
        _maybe_traceback()
        return EXIT_FAIL, f"cannot join the {config.backend} process group: {one_line(exc)}", []
    try:
        # Deferred: loop imports the model and data code, which --help never needs.
        from pycomm.train import report
        from pycomm.train.loop import train

        result = train(config, on_progress=rank == 0)
        if dist.get_rank() == 0:  # rank 0 of the group as it ends (a shrink may have renumbered it)
            print(report.summary(config, result), flush=True)
            if config.json_path:
                report.write_json(config.json_path, report.as_json(config, result))
            if config.plot_path:
                report.write_plot(config.plot_path, config, result)
    except Exception as exc:  # noqa: BLE001
        _maybe_traceback()
        # No destroy_process_group: peers may be stuck in a collective with us,
        # and tearing down could block; process exit closes the connections.
        return EXIT_FAIL, one_line(exc), []
    dist.destroy_process_group()
    return EXIT_OK, None, result.lost_ranks


def _maybe_traceback() -> None:
    if os.environ.get(TRACEBACK_ENV) == "1":
        traceback.print_exc()


def run_existing_rank(config: TrainConfig) -> int:
    """This process is one rank of a torchrun job, on any number of hosts."""
    rank = int(os.environ["RANK"])

    def join(timeout: datetime.timedelta) -> None:
        store = _agent_store(timeout)
        if store is None:
            dist.init_process_group(config.backend, init_method="env://", timeout=timeout)
        else:
            world = int(os.environ["WORLD_SIZE"])
            dist.init_process_group(config.backend, store=store, rank=rank, world_size=world, timeout=timeout)

    code, message, _ = run_rank(config, rank, join)
    if message:
        print(f"pycomm.train: error: rank {rank}: {message}", file=sys.stderr, flush=True)
    return code


def _agent_store(timeout: datetime.timedelta) -> dist.Store | None:
    """The torchrun agent's store, with a prefix of its own for each restart; None: not shared.

    With the c10d rendezvous torchrun's agent shares its own store with the workers and keeps it
    across restarts, and env:// uses it without any per-restart prefix (torch's comment says a
    new store is made per restart; with the shared store it is not). The workers of a restart
    then read the keys their killed predecessors wrote, such as a dead rank's listening
    address, and fail to connect. A prefix per restart gives each incarnation keys of its own.

    Only on one node: each node's agent counts its own restarts (one whose workers were
    stopped because another node's failed may not count it), so across nodes the counts can
    disagree. There, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (read by the agents) makes rank 0
    serve a new store on a new port for every restart instead, and this returns None.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None  # rank 0 serves a new store per restart: no stale keys
    if os.environ.get("GROUP_WORLD_SIZE", "1") != "1":
        return None  # several nodes: see above
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    return dist.PrefixStore(f"pycomm.train/restart-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def spawn_entry(rank: int, store_addr: tuple[str, int], config: TrainConfig, world: int, results: mp.Queue) -> None:  # type: ignore[type-arg]
    def join(timeout: datetime.timedelta) -> None:
        store = dist.TCPStore(store_addr[0], store_addr[1], world, is_master=False, timeout=timeout)
        dist.init_process_group(config.backend, store=store, rank=rank, world_size=world, timeout=timeout)

    try:
        code, message, lost = run_rank(config, rank, join)
    except KeyboardInterrupt:
        # Ctrl-C reaches every rank (same process group); the launcher says so once.
        sys.exit(130)
    results.put((rank, message, lost))
    sys.exit(code)


def run_local(config: TrainConfig) -> int:
    """Start ``config.nproc`` ranks on this host (forked: pycomm.ranks.fork_ranks) and wait for them.

    The launcher serves the rendezvous TCPStore itself on a port the OS picks
    (port 0): no free-port race between choosing and binding, and the store
    outlives any one rank.
    """
    world = config.nproc
    results = mp.get_context("fork").Queue()
    # SIGTERM (a CI timeout, a job scheduler) must not orphan the ranks:
    # forked children outlive a parent that dies, and would train on alone.
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    procs: list[mp.process.BaseProcess] = []
    try:
        procs, _store = fork_ranks(
            world, spawn_entry, (config, world, results), config.timeout_s,
            lambda: dist.TCPStore(
                "127.0.0.1", 0, world, is_master=True, timeout=datetime.timedelta(seconds=config.timeout_s),
                wait_for_workers=False,
            ),
        )
        if config.on_failure == "shrink":
            reports = _wait_carrying_on(procs, results)
        else:
            wait_ranks(procs)
            reports = {}
    except (KeyboardInterrupt, _Terminated) as stop:
        terminate_ranks(procs)
        return 128 + (signal.SIGTERM if isinstance(stop, _Terminated) else signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous)
    reports.update(_drain(results))
    messages = {rank: message for rank, (message, _) in reports.items() if message}
    lost = {r for _, ranks in reports.values() for r in ranks}
    codes = [proc.exitcode for proc in procs]
    if lost:
        print(f"pycomm.train: went on without rank(s) {sorted(lost)}", file=sys.stderr, flush=True)
        codes = [0 if rank in lost else code for rank, code in enumerate(codes)]
    report_silent_deaths("pycomm.train", codes, messages)
    # Then one line per distinct problem: ranks usually fail for one reason
    # (a bad PYCOMM_* variable, a peer gone), and world copies of it bury the rest.
    seen: dict[str, list[int]] = {}
    for rank in sorted(messages):
        seen.setdefault(messages[rank], []).append(rank)
    for message, ranks in seen.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"
        print(f"pycomm.train: error: {who}: {message}", file=sys.stderr, flush=True)
    return EXIT_OK if all(code == 0 for code in codes) else EXIT_FAIL


def _drain(results: mp.Queue) -> dict[int, tuple[str | None, list[int]]]:  # type: ignore[type-arg]
    """The (message, lost ranks) of every rank that reported and has not been read."""
    reports = {}
    while True:
        try:
            rank, message, lost = results.get(timeout=0.1)
        except queue.Empty:
            return reports
        reports[rank] = (message, lost)


def _wait_carrying_on(procs: list[mp.process.BaseProcess], results: mp.Queue) -> dict[int, tuple[str | None, list[int]]]:  # type: ignore[type-arg]
    """--on-failure shrink: a rank's death does not end the others. Once every rank has reported or
    is among the ranks the reports say were lost, a lost rank still there (a frozen one) is killed."""
    reports: dict[int, tuple[str | None, list[int]]] = {}
    deadline: float | None = None
    while any(proc.is_alive() for proc in procs):
        for proc in procs:
            proc.join(timeout=0.05)
        reports.update(_drain(results))
        lost = {r for _, ranks in reports.values() for r in ranks}
        if reports and all(rank in reports or rank in lost for rank in range(len(procs))):
            break  # every survivor is done: what is left is a lost rank (frozen)
        # A survivor that failed (its recovery did not work) ends the run as wait_ranks would: the
        # others get the grace period, then go, a frozen rank with them.
        crashed = any(
            proc.exitcode not in (None, 0) and rank not in lost and rank not in reports for rank, proc in enumerate(procs)
        )
        if deadline is None and (crashed or any(message for message, _ in reports.values())):
            deadline = time.monotonic() + GRACE_S
        if deadline is not None and time.monotonic() > deadline:
            break
    lost = {r for _, ranks in reports.values() for r in ranks}
    for rank in lost:
        if procs[rank].is_alive():
            procs[rank].kill()  # a frozen rank takes no SIGTERM
    # The ranks that reported are on their way out; the others (after a failed recovery) get the
    # grace period that has begun.
    end = time.monotonic() + GRACE_S
    for proc in procs:
        proc.join(timeout=max(0.0, end - time.monotonic()))
    terminate_ranks(procs)
    return reports


class _Terminated(Exception):
    pass


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated
