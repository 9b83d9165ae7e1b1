"""Run a function on N freshly spawned ranks of a torch.distributed process group.

Every multi-process test goes through :func:`run_ranks`, or through cluster.Cluster when the test
must act on running ranks (kill one, talk to its port, read its stderr); both start, time out and
reap ranks with the helpers here. run_ranks owns the whole life cycle of the children (spawn,
rendezvous, teardown, reaping) and enforces a hang timeout itself, because pytest-timeout is not
available and a collective backend under test is exactly the kind of code that deadlocks.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing
import os
import pickle
import random
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

# Once one rank has failed, the others are usually stuck in a collective that
# will never complete; give them this long to report their own error, then kill.
_GRACE_AFTER_FAILURE_S = 10.0
# Time allowed for a rank to exit after it has sent its result.
_EXIT_GRACE_S = 20.0
_MAX_REPORT_CHARS = 20_000


class RanksFailed(AssertionError):
    """One or more ranks raised, crashed or hung. The message has per-rank details."""


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (the only address tests may use).

    Under pytest-xdist (scripts/test.sh runs two workers) a port the kernel handed out here could be
    handed to the other worker before this one binds it again, so each worker draws from its own
    range below the kernel's ephemeral ports (which start at 32768), where no outgoing connection
    takes one either."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        first = 20000 + 2000 * (int(worker[2:]) % 6)
        for _ in range(200):
            port = random.randrange(first, first + 2000)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The variables every rank runs with: one intra-op thread (ranks share 2 cores on CI)."""
    return {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(extra or {})}


@contextlib.contextmanager
def patched_environ(values: dict[str, str]) -> Iterator[None]:
    """Set env vars only while children are started: spawn copies os.environ at start (and some,
    e.g. TORCH_DISTRIBUTED_DEBUG, are read when the child imports torch, before its main runs)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def _child_main(
    rank: int,
    world_size: int,
    backend: str,
    init_method: str,
    pg_options: Any,
    pg_timeout_s: float | None,
    destroy: bool,
    fn: Callable[..., Any],
    args: Sequence[Any],
    conn: Connection,
    env: dict[str, str],
) -> None:
    install_stack_dump()
    # Set here too: a forkserver child inherits the server's environment, not ours.
    os.environ.update(env)
    ok = False
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if backend == "pycomm":
            import pycomm  # noqa: F401  (registers the backend)

        kwargs: dict[str, Any] = {}
        if pg_timeout_s is not None:
            kwargs["timeout"] = timedelta(seconds=pg_timeout_s)
        if pg_options is not None:
            kwargs["pg_options"] = pg_options
        dist.init_process_group(
            backend, init_method=init_method, rank=rank, world_size=world_size, **kwargs
        )
        result = fn(rank, world_size, *args)
        if destroy and dist.is_initialized():
            dist.destroy_process_group()
        payload = pickle.dumps(("ok", result))
        ok = True
    except BaseException:  # noqa: BLE001  (report everything, including SystemExit)
        payload = pickle.dumps(("error", traceback.format_exc()))
    try:
        conn.send_bytes(payload)
        conn.close()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        if not ok or not destroy:
            # A group that failed (or that we chose not to destroy) may have
            # background threads stuck in the backend; a normal interpreter
            # exit could block on them, so leave immediately.
            os._exit(0 if ok else 1)


def install_stack_dump() -> None:
    """In a rank: SIGUSR1 from the test (on hang) dumps every thread's Python stack to stderr,
    which pytest captures (or the rank's log holds) and shows next to the failure."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def _context() -> multiprocessing.context.BaseContext:
    """ "forkserver" (default): ranks are forked from one server process that has
    imported torch once (preloaded) and started no threads, which removes the
    ~1.5 s CPU of ``import torch`` per rank and cuts the suite from ~6 to ~2
    minutes on 2 cores. PYCOMM_TEST_START_METHOD=spawn gives each rank a fresh
    interpreter with nothing inherited.
    """
    method = os.environ.get("PYCOMM_TEST_START_METHOD", "forkserver")
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        # torch._dynamo (imported by the first optimizer or functional collective) and FSDP2 / tensor
        # parallelism cost each rank 1.5-2.5 s of CPU to import; once in the server instead.
        ctx.set_forkserver_preload(
            ["torch", "torch.distributed", "torch._dynamo", "torch.distributed.fsdp", "torch.distributed.tensor.parallel"]
        )
        # Started here, outside any test's patched environment: a server started while ranks start
        # (start_ranks) keeps that test's variables and hands them to every later test's ranks.
        multiprocessing.forkserver.ensure_running()
    return ctx


def _init_method(init: str, port: int, tmpdir: str) -> tuple[str, dict[str, str]]:
    if init == "env":
        return "env://", {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    if init == "tcp":
        return f"tcp://127.0.0.1:{port}", {}
    if init == "file":
        return f"file://{os.path.join(tmpdir, 'rendezvous')}", {}
    raise ValueError(f"init must be 'env', 'tcp' or 'file', not {init!r}")


def dump_stacks(procs: Sequence[BaseProcess], ranks: Sequence[int]) -> None:
    """Ask the live ones of ``ranks`` for their Python stacks (install_stack_dump) and give them
    a second to write them; a stopped rank is continued first, or it could not answer."""
    live = [pid for rank in ranks if procs[rank].is_alive() and (pid := procs[rank].pid) is not None]
    for pid in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGUSR1)
    if live:
        time.sleep(1.0)  # let faulthandler write the stacks


def kill_all(procs: Sequence[BaseProcess]) -> None:
    """SIGKILL every live rank (continued first, in case a test stopped it) and reap it."""
    for proc in procs:
        if proc.is_alive() and proc.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.join(timeout=10)


def start_ranks(
    ctx: multiprocessing.context.BaseContext,
    world_size: int,
    env: dict[str, str],
    target: Callable[..., None],
    args_of: Callable[[int, Connection], tuple[Any, ...]],
    *,
    duplex: bool,
) -> tuple[list[BaseProcess], list[Connection]]:
    """Start ``world_size`` daemon ranks ``target(*args_of(rank, child_end))`` with ``env`` set while
    they start, each with a pipe whose other end the test keeps (the reading end when not duplex).
    If a start fails, the ranks already started are killed."""
    procs: list[BaseProcess] = []
    conns: list[Connection] = []
    try:
        with patched_environ(env):
            for rank in range(world_size):
                test_end, child_end = ctx.Pipe(duplex=duplex)  # (reader, writer) when not duplex
                proc = ctx.Process(target=target, name=f"rank{rank}", args=args_of(rank, child_end), daemon=True)
                proc.start()
                child_end.close()
                procs.append(proc)
                conns.append(test_end)
    except BaseException:
        kill_all(procs)
        for conn in conns:
            conn.close()
        raise
    return procs, conns


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *,
    backend: str,
    timeout_s: float = 60.0,
    init: str = "env",
    pg_options: Any = None,
    args: Sequence[Any] = (),
    pg_timeout_s: float | None = None,
    destroy: bool = True,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks.

    Returns the per-rank return values (which must be picklable), in rank order.
    Raises :class:`RanksFailed` with every rank's traceback if any rank raised,
    died, or did not finish within ``timeout_s`` (hung ranks are SIGKILLed after
    their stacks are dumped to stderr). ``fn`` must be a module-level function.
    ``destroy=False`` skips destroy_process_group (for tests that leave the group
    unusable on purpose). ``env`` is set in every rank before it imports pycomm, whatever the
    start method (a forkserver child inherits the server's environment, not the test's).
    """
    __tracebackhide__ = True  # pytest: show the rank report, not launcher internals
    ctx = _context()
    port = free_port()
    tmpdir = tempfile.mkdtemp(prefix="pycomm-test-")
    init_method, rendezvous_env = _init_method(init, port, tmpdir)
    # Keep gloo (reference backend) on loopback whatever the hostname resolves to.
    child_env = rank_environment({"GLOO_SOCKET_IFNAME": "lo", **rendezvous_env, **(env or {})})
    procs: list[BaseProcess] = []
    conns: list[Connection] = []
    try:
        procs, conns = start_ranks(
            ctx,
            world_size,
            child_env,
            _child_main,
            lambda rank, writer: (
                rank, world_size, backend, init_method, pg_options, pg_timeout_s, destroy, fn, tuple(args), writer,
                child_env,
            ),
            duplex=False,
        )
        return _collect(procs, conns, timeout_s)
    finally:
        kill_all(procs)
        for conn in conns:
            conn.close()
        shutil.rmtree(tmpdir, ignore_errors=True)


def _collect(
    procs: Sequence[BaseProcess], conns: Sequence[Connection], timeout_s: float
) -> list[Any]:
    __tracebackhide__ = True
    start = time.monotonic()
    deadline = start + timeout_s
    results: dict[int, Any] = {}
    problems: dict[int, str] = {}
    pending = set(range(len(procs)))

    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        handles: list[Any] = [conns[r] for r in pending] + [
            procs[r].sentinel for r in pending
        ]
        ready = wait(handles, timeout=remaining)
        for rank in sorted(pending):
            conn, proc = conns[rank], procs[rank]
            if conn in ready or (proc.sentinel in ready and conn.poll(0)):
                try:
                    status, value = pickle.loads(conn.recv_bytes())
                except EOFError:
                    proc.join(timeout=5)
                    problems[rank] = (
                        f"exited with code {proc.exitcode} without reporting a result"
                    )
                else:
                    if status == "ok":
                        results[rank] = value
                    else:
                        problems[rank] = f"raised:\n{value}"
                pending.discard(rank)
            elif proc.sentinel in ready:
                proc.join(timeout=5)
                problems[rank] = (
                    f"exited with code {proc.exitcode} without reporting a result"
                )
                pending.discard(rank)
        if problems:
            deadline = min(deadline, time.monotonic() + _GRACE_AFTER_FAILURE_S)

    hung = sorted(pending)
    if hung:
        elapsed = time.monotonic() - start
        dump_stacks(procs, hung)
        kill_all(procs)
        for rank in hung:
            problems[rank] = (
                f"hung: no result after {elapsed:.1f}s (timeout {timeout_s}s); killed. "
                "Its Python stacks are in the captured stderr."
            )
    else:
        # Every rank reported; they must also exit cleanly (a crash or hang at
        # teardown is a backend bug too).
        exit_deadline = time.monotonic() + max(
            _EXIT_GRACE_S, deadline - time.monotonic()
        )
        for rank, proc in enumerate(procs):
            proc.join(timeout=max(0.0, exit_deadline - time.monotonic()))
            if proc.is_alive():
                problems.setdefault(
                    rank, "returned its result but did not exit (hang at teardown)"
                )
            elif proc.exitcode != 0:
                problems.setdefault(
                    rank, f"returned its result but exited with code {proc.exitcode}"
                )

    if problems:
        header = f"ranks {hung} hung; " if hung else ""
        lines = [f"{header}{len(problems)} of {len(procs)} ranks failed:"]
        lines += [f"--- rank {rank} {problems[rank]}" for rank in sorted(problems)]
        message = "\n".join(lines)
        if len(message) > _MAX_REPORT_CHARS:
            message = message[:_MAX_REPORT_CHARS] + "\n... (truncated)"
        raise RanksFailed(message)
    return [results[rank] for rank in range(len(procs))]
