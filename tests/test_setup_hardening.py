"""Group setup against strangers that try to stop it or to get in.

(1) A flood of silent connections to rank 0 while it is short of file descriptors and rank 1 is
late (held back until the test releases it): the group still forms, and rank 0 does not spin meanwhile. (2) After setup, a rank whose
descriptors are all in use is sent connections: its event loop does not spin and its collectives
still work. (3) A stranger squatting on the address in the store learns nothing of the group
token and is refused by the connecting rank. (4) The bytes of a real handshake, captured between
two ranks, neither carry the token nor work when replayed, and a rank already connected cannot be
displaced.

The ranks are run by cluster.Cluster (spawned ranks, a pipe to each, a hang deadline). Figures are printed with the ``[reliability]`` prefix (``-s``); docs/RELIABILITY-setup.md
quotes them.
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from cluster import Cluster, Control, report
from strangers import CHALLENGE, HELLO_MAGIC, HELLO_VERSION, await_close, converse, dropped_lines, formed_worker, hello_for

FLOOD = 80  # silent connections held open against rank 0
SPARE_FDS = 30  # rank 0's descriptor headroom during setup
CPU_BOUND = 0.5  # of one core, averaged over the wait: a spinning accept loop uses ~1.0


_GO_KEY = "pycomm-test/go/"


def _hold_backend(ranks: tuple[int, ...]) -> Callable[[int], None]:
    """A before_init hook: on `ranks`, pycomm's backend creator waits until the test sets
    _GO_KEY + rank in the group's store (see _release), so the test decides when those ranks
    start their setup, with no guessed delays."""

    def install(rank: int) -> None:
        if rank not in ranks:
            return
        plugin = dist.Backend._plugins["PYCOMM"]
        create = plugin.creator_fn

        def held_create(dist_options: Any, *args: Any, **kwargs: Any) -> Any:
            dist_options.store.wait([f"{_GO_KEY}{rank}"], timedelta(seconds=90))
            return create(dist_options, *args, **kwargs)

        dist.Backend._plugins["PYCOMM"] = plugin._replace(creator_fn=held_create)

    return install


def _release(c: Cluster, rank: int) -> None:
    """Lets a rank held by _hold_backend create its backend."""
    prefix = c.store_key("pycomm/addr/0", timeout=60)[: -len("pycomm/addr/0")]
    c.store().set(f"{prefix}{_GO_KEY}{rank}", b"1")


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir used


def _squeeze_rank0_hold_rank1(rank: int) -> None:
    """before_init: rank 0 keeps only SPARE_FDS free descriptors; rank 1 waits for the test."""
    if rank == 0:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (_open_fds() + SPARE_FDS, hard))
    _hold_backend((1,))(rank)


def _hold_rank1(rank: int) -> None:
    _hold_backend((1,))(rank)


def _hold_ranks_1_and_2(rank: int) -> None:
    _hold_backend((1, 2))(rank)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Flood:
    """Keeps `count` silent connections open to `address` from a thread, reconnecting any the
    rank closes, until stopped: a stranger that does not give up."""

    def __init__(self, address: tuple[str, int], count: int) -> None:
        self.address = address
        self.count = count
        self.connects = 0
        self.closed_by_rank = 0
        self._stop = threading.Event()
        self._socks: list[socket.socket | None] = [None] * count
        self._thread = threading.Thread(target=self._run, name="flood", daemon=True)

    def __enter__(self) -> _Flood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for s in self._socks:
            if s is not None:
                s.close()

    def _connect(self, i: int) -> None:
        s = None
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.settimeout(1.0)
            s.connect(self.address)  # may time out while the rank's backlog is full: tried again
            s.setblocking(False)
            self._socks[i] = s
            self.connects += 1
        except OSError:
            if s is not None:
                s.close()
            self._socks[i] = None

    def _run(self) -> None:
        while not self._stop.is_set():
            for i in range(self.count):
                if self._socks[i] is None:
                    self._connect(i)
            live = [s for s in self._socks if s is not None]
            readable, _, _ = select.select(live, [], [], 0.05)
            for s in readable:
                try:
                    data = s.recv(4096)  # a challenge is ignored; EOF means the rank let go
                except OSError:
                    data = b""
                if data == b"":
                    self.closed_by_rank += 1
                    i = self._socks.index(s)
                    s.close()
                    self._socks[i] = None
            time.sleep(0.05)


def _summarised(lines: list[str]) -> int:
    """The K of every '... and K more dropped connections' line."""
    total = 0
    for line in lines:
        if "more dropped connections" in line:
            total += int(line.split("and ", 1)[1].split()[0])
    return total


# --------------------------------------------------------------------------------------------
# (1) During setup.


def test_group_forms_under_a_flood_with_few_file_descriptors(pycomm: ModuleType) -> None:
    with Cluster(
        formed_worker, 2, pg_timeout_s=30, hang_timeout_s=120, before_init=_squeeze_rank0_hold_rank1
    ) as c:
        address = c.pycomm_address(0, timeout=60)  # rank 0 is accepting; rank 1 is held
        pid0 = c.pid(0)
        cpu_start, t_start = _cpu_seconds(pid0), time.monotonic()
        with _Flood(address, FLOOD) as flood:
            # Long enough for the first strangers' handshake deadline (2.5 s) to pass, so rank 1
            # arrives while rank 0 is cycling through strangers at its descriptor limit.
            time.sleep(3.0)
            _release(c, 1)
            released_at = time.monotonic()
            formed_at = c.wait_event(0, "formed", timeout=45)
            cpu = _cpu_seconds(pid0) - cpu_start
            wait_s = formed_at - t_start
            c.wait_event(1, "formed", timeout=30)
        for rank in range(2):
            c.send(rank, "done")
        results = [c.result(r, timeout=60) for r in range(2)]
        log0 = c.stderr(0)

    lines = [line for line in log0.splitlines() if "dropped connection" in line]
    report(
        f"flood during setup ({FLOOD} held, {SPARE_FDS} spare fds on rank 0): the group formed "
        f"{formed_at - released_at:.2f} s after rank 1 was released, {wait_s:.2f} s after the flood "
        f"began; rank 0 used {cpu:.2f} s CPU ({100 * cpu / wait_s:.0f}% "
        f"of a core); the flood connected {flood.connects} times, rank 0 closed "
        f"{flood.closed_by_rank}; rank 0 logged {len(lines)} lines about dropped connections "
        f"(summaries counting {_summarised(lines)} more)"
    )
    assert all(r["ok"] for r in results), results
    assert cpu / wait_s < CPU_BOUND, f"rank 0 used {cpu:.2f} s CPU over a {wait_s:.2f} s wait"
    assert flood.closed_by_rank > 0, "rank 0 never let go of a silent connection"
    # Rate-limited: at most a burst a second, plus one summary line per second.
    assert len(lines) <= 25 * (wait_s + 3), f"{len(lines)} lines in {wait_s:.1f} s:\n{log0[-3000:]}"


# --------------------------------------------------------------------------------------------
# (2) After setup: no spare descriptor at all.


def _lowest_free_fd() -> int:
    fd = os.open("/dev/null", os.O_RDONLY)
    os.close(fd)
    return fd


def _squeezed_loop_worker(rank: int, world: int, ctl: Control) -> dict[str, Any]:
    def checked_allreduce(step: int) -> bool:
        t = torch.full((50_000,), float(rank + step))
        dist.all_reduce(t)
        return bool(torch.all(t == sum(r + step for r in range(world))))

    ok = [checked_allreduce(0)]
    ctl.event("ready")
    out: dict[str, Any] = {}
    if rank == 0:
        assert ctl.command() == "squeeze"
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        # Every descriptor number below the limit is in use: the next accept gets EMFILE.
        resource.setrlimit(resource.RLIMIT_NOFILE, (_lowest_free_fd(), hard))
        try:
            ctl.event("squeezed")
            assert ctl.command() == "measure"
            before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
            time.sleep(2.0)
            after, t1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            out["cpu_fraction"] = cpu / (t1 - t0)
            ctl.event("measured")
            assert ctl.command() == "go"
            ok += [checked_allreduce(step) for step in range(1, 6)]  # still without a spare fd
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    else:
        assert ctl.command() == "go"
        ok += [checked_allreduce(step) for step in range(1, 6)]
    out["ok"] = all(ok)
    return out


def test_event_loop_does_not_spin_when_out_of_file_descriptors(pycomm: ModuleType) -> None:
    with Cluster(_squeezed_loop_worker, 2, pg_timeout_s=30, hang_timeout_s=90) as c:
        for rank in range(2):
            c.wait_event(rank, "ready", timeout=60)
        address = c.pycomm_address(0)
        c.send(0, "squeeze")
        c.wait_event(0, "squeezed", timeout=30)
        socks = [socket.create_connection(address, timeout=5) for _ in range(20)]
        c.send(0, "measure")
        c.wait_event(0, "measured", timeout=30)
        outcomes = [await_close(s, 2.0) for s in socks]
        for s in socks:
            s.close()
        for rank in range(2):
            c.send(rank, "go")
        results = [c.result(r, timeout=60) for r in range(2)]
        log0 = c.stderr(0)

    cpu = results[0]["cpu_fraction"]
    report(
        f"after setup, out of descriptors, 20 strangers: rank 0 used {100 * cpu:.0f}% of a core over "
        f"2 s; outcomes {sorted(set(outcomes))}; {len(dropped_lines(log0))} 'dropped connection' lines"
    )
    assert all(r["ok"] for r in results), results
    assert cpu < CPU_BOUND, f"rank 0's event loop used {100 * cpu:.0f}% of a core with no spare fd"
    assert all(o == "closed" for o in outcomes), outcomes


# --------------------------------------------------------------------------------------------
# (3) A squatter on the published address.


def _init_only_worker(rank: int, world: int, ctl: Control) -> str:
    return "formed"


class _Squatter:
    """Listens where the store now says rank 0 is, and plays whichever protocol the connecting
    rank speaks: answers an old-style hello with rank 0's ack, or sends a challenge and, after the
    hello, a welcome with a made-up authentication code. Records what it was sent."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.received = b""
        self.thread = threading.Thread(target=self._run, name="squatter", daemon=True)
        self.thread.start()

    def _read_for(self, conn: socket.socket, seconds: float) -> None:
        conn.settimeout(0.1)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with contextlib.suppress(TimeoutError):
                data = conn.recv(4096)
                if not data:
                    return
                self.received += data

    def _run(self) -> None:
        self.listener.settimeout(30)
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        with conn, contextlib.suppress(OSError):
            self._read_for(conn, 0.5)
            if self.received:  # the connector spoke first: the old protocol
                conn.sendall((0).to_bytes(4, "little"))
            else:
                conn.sendall(CHALLENGE.pack(HELLO_MAGIC, HELLO_VERSION, os.urandom(16)))
                self._read_for(conn, 1.0)
                fake = HELLO_MAGIC.to_bytes(4, "little") + HELLO_VERSION.to_bytes(4, "little")
                conn.sendall(fake + (0).to_bytes(4, "little") + os.urandom(32))
            self._read_for(conn, 3.0)

    def close(self) -> None:
        self.listener.close()
        self.thread.join(timeout=10)


def _error_line(traceback_text: Any) -> str:
    """The exception line of a rank's traceback (torch may append C++ frames after it)."""
    lines = [line for line in str(traceback_text).splitlines() if "Error: " in line]
    return lines[-1].strip() if lines else str(traceback_text).strip()[-300:]


def _result_message(c: Cluster, rank: int, timeout: float) -> tuple[str, Any]:
    message = c._wait_for(rank, lambda m: m[0] == "result", "result", timeout)
    return message[1], message[2]


def test_a_squatter_gets_no_token_and_is_refused(pycomm: ModuleType) -> None:
    with Cluster(
        _init_only_worker, 2, pg_timeout_s=8, hang_timeout_s=90, before_init=_hold_rank1
    ) as c:
        key = c.store_key("pycomm/addr/0", timeout=60)
        token = c.store().get(c.store_key("pycomm/token"))
        squatter = _Squatter()
        try:
            c.store().set(key, f"{squatter.address[0]}:{squatter.address[1]}")
            _release(c, 1)
            status1, value1 = _result_message(c, 1, timeout=40)
        finally:
            squatter.close()
        status0, value0 = _result_message(c, 0, timeout=40)

    report(
        f"squatter: received {len(squatter.received)} bytes; rank 1 {status1}: {_error_line(value1)[:300]}"
    )
    problems = []
    if token in squatter.received:
        problems.append("the squatter received the group token")
    if status1 != "error":
        problems.append("rank 1 formed a group with a squatter in rank 0's place")
    else:
        last = _error_line(value1)
        for word in ("rank 1", "peer 0", "prove"):
            if word not in last:
                problems.append(f"rank 1's error does not say {word!r}: {last}")
    if status0 != "error" or "waiting for peers 1" not in _error_line(value0):
        problems.append(f"rank 0 should have timed out waiting for rank 1: {status0} {_error_line(value0)}")
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------------------------
# (4) A handshake captured between two ranks.


class _Proxy:
    """Forwards connections to `target`, recording what each connector sent."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.sent: list[bytearray] = []  # per connection, connector -> target
        self.answered: list[bytearray] = []  # per connection, target -> connector
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, name="proxy", daemon=True)]
        self._threads[0].start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bytearray) -> None:
        with contextlib.suppress(OSError):
            while not self._stop.is_set():
                ready, _, _ = select.select([src], [], [], 0.1)
                if not ready:
                    continue
                data = src.recv(1 << 16)
                if not data:
                    break
                record += data
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def _accept(self) -> None:
        self.listener.settimeout(0.1)
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server = socket.create_connection(self.target, timeout=5)
            sent, answered = bytearray(), bytearray()
            self.sent.append(sent)
            self.answered.append(answered)
            for args in ((client, server, sent), (server, client, answered)):
                t = threading.Thread(target=self._pump, args=args, daemon=True)
                t.start()
                self._threads.append(t)

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        for t in self._threads:
            t.join(timeout=5)


def _sum_worker(rank: int, world: int, ctl: Control) -> dict[str, Any]:
    t = torch.arange(1000, dtype=torch.int64) * (rank + 1)
    dist.all_reduce(t)
    ok = torch.equal(t, torch.arange(1000, dtype=torch.int64) * sum(range(1, world + 1)))
    ctl.event("formed")
    assert ctl.command() == "done"
    return {"ok": ok}


def test_a_captured_handshake_gives_no_way_in(pycomm: ModuleType) -> None:
    with Cluster(_sum_worker, 3, pg_timeout_s=30, hang_timeout_s=120, before_init=_hold_ranks_1_and_2) as c:
        key = c.store_key("pycomm/addr/0", timeout=60)
        address0 = c.pycomm_address(0)
        token = c.store().get(c.store_key("pycomm/token"))
        proxy = _Proxy(address0)
        try:
            c.store().set(key, f"{proxy.address[0]}:{proxy.address[1]}")  # rank 1 goes through it
            _release(c, 1)
            start = time.monotonic()
            # Rank 1 has spoken and been answered, and the exchange has gone quiet.
            seen = (-1, -1)
            while True:
                now = (len(proxy.sent[0]), len(proxy.answered[0])) if proxy.sent else (0, 0)
                if now == seen and now[0] >= 32 and now[1] >= 4:
                    break
                assert time.monotonic() - start < 30, "rank 1 never connected to rank 0 through the proxy"
                seen = now
                time.sleep(0.3)
            captured = bytes(proxy.sent[0])

            # Replay what rank 1 sent, on a connection of our own.
            with socket.create_connection(address0, timeout=5) as s:
                replay = converse(s, captured)
            # A store reader (who has the token) claiming the rank that is already connected.
            with socket.create_connection(address0, timeout=5) as s:
                displace = converse(s, lambda nonce: hello_for(token, nonce, 1, 0))
            _release(c, 2)  # only now: rank 0 was accepting all along
            for rank in range(3):
                c.wait_event(rank, "formed", timeout=60)
            for rank in range(3):
                c.send(rank, "done")
            results = [c.result(r, timeout=60) for r in range(3)]
        finally:
            proxy.close()
        log0 = c.stderr(0)

    dropped = dropped_lines(log0)
    report(
        f"captured handshake: {len(captured)} bytes from rank 1; replay {replay}, displacement "
        f"{displace}; rank 0 warnings: " + " | ".join(line[line.find("dropped"):][:120] for line in dropped)
    )
    problems = []
    if token in captured:
        problems.append("the group token crossed the wire in rank 1's handshake")
    if replay != "closed":
        problems.append(f"replayed handshake: {replay} (expected closed)")
    if displace != "closed":
        problems.append(f"a second rank 1: {displace} (expected closed)")
    if not any("wrong group token" in line for line in dropped):
        problems.append("rank 0 did not log the replay as an authentication failure")
    if not any("rank already connected" in line for line in dropped):
        problems.append("rank 0 did not log the second rank 1 as already connected")
    if not all(r["ok"] for r in results):
        problems.append(f"wrong all_reduce results: {results}")
    if problems:
        problems.append(f"rank 0 stderr:\n{log0[-3000:]}")
    assert not problems, "\n".join(problems)
