"""Strangers on a rank's listening port, during setup and while the group runs, and the address
it listens on: the interface that reaches the rendezvous host, never the wildcard.

Measured figures are printed with the ``[reliability]`` prefix (run with ``-s``); see
docs/RELIABILITY.md. Ranks run under cluster.Cluster, or mp.run_ranks where only their results matter.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from cluster import Cluster, Control, report
from strangers import (
    CHALLENGE_PREFIX,
    await_close,
    dropped_lines,
    formed_worker,
    frame_header,
    hello_for,
    read_challenge,
    send_and_close,
    stranger,
    stranger_payloads,
)


# Strangers on a rank's listening port, during setup and while the group runs.


def _checked_allreduce_loop_worker(rank: int, world: int, ctl: Control) -> dict[str, Any]:
    """int64 all-reduces of several sizes, each result checked exactly, until rank 0 is told to
    stop; the stop flag travels in the last element so every rank stops at the same step."""
    sizes = (4097, 65_537, 300_001)  # one-chunk, a few chunks, many chunks
    ranks_sum = sum(range(world))
    wrong: list[str] = []
    done_at: list[float] = []
    start = time.monotonic()
    i = 0
    while True:
        n = sizes[i % len(sizes)]
        base = torch.arange(n, dtype=torch.int64)
        t = base * (rank + 1) + rank * 1_000_003 + i
        stop = rank == 0 and (ctl.poll() == "stop" or time.monotonic() - start > 120)
        t[-1] = 1 if stop else 0
        dist.all_reduce(t)
        expected = base * (world * (world + 1) // 2) + ranks_sum * 1_000_003 + world * i
        if not torch.equal(t[:-1], expected[:-1]):
            bad = int((t[:-1] != expected[:-1]).sum())
            wrong.append(f"step {i}: {bad} of {n - 1} elements wrong")
        done_at.append(time.monotonic())
        i += 1
        if i == 3:
            ctl.event("looping", os.getpid())
        if int(t[-1]) > 0:
            break
    return {"wrong": wrong, "done_at": done_at}



def test_strangers_after_setup_are_dropped(pycomm: ModuleType) -> None:
    with Cluster(_checked_allreduce_loop_worker, 2, pg_timeout_s=30, hang_timeout_s=120) as c:
        c.wait_looping()
        address = c.pycomm_address(0)
        token = c.store().get(c.store_key("pycomm/token"))
        outcomes: dict[str, str] = {}
        t_first = time.monotonic()
        rounds = 3  # spread over ~2 s, so that they overlap many all_reduces
        not_closed: list[str] = []

        def record(name: str, outcome: str) -> None:
            outcomes[name] = outcome
            if outcome != "closed":
                not_closed.append(f"stranger {name}: {outcome} (expected the rank to close it)")

        for _ in range(rounds):
            for name, payload in stranger_payloads(token).items():
                record(name, stranger(address, payload))
                time.sleep(0.05)
            record("silent", stranger(address, b""))
            record("truncated_header", stranger(address, frame_header(4096)[:20]))
            send_and_close(address, b"\x00" * 7)  # says a little and leaves
            time.sleep(0.1)
        flood = 100
        socks = [socket.create_connection(address, timeout=5) for _ in range(flood)]
        flood_outcomes = [await_close(s, 4.0) for s in socks]
        for s in socks:
            s.close()
        strangers_done = time.monotonic()
        time.sleep(1.1)  # the group must keep working after all that
        # Warnings are rate-limited: one more stranger, a second later, makes rank 0 log how many
        # it held back.
        record("late", stranger(address, b""))
        n_strangers = rounds * (len(outcomes) - 1) + rounds + flood + 1
        c.send(0, "stop")
        results = [c.result(r, timeout=60) for r in range(2)]
        log0 = c.stderr(0)

    dropped = dropped_lines(log0)
    summaries = [line for line in log0.splitlines() if "more dropped connections" in line]
    held_back = sum(int(line.split(" and ", 1)[1].split()[0]) for line in summaries)
    after = [sum(1 for t in res["done_at"] if t > strangers_done) for res in results]
    during = [sum(1 for t in res["done_at"] if t_first <= t <= strangers_done) for res in results]
    report(
        f"strangers after setup: {n_strangers} connections, outcomes {outcomes}, "
        f"{len(dropped)} 'dropped connection' warnings and {len(summaries)} summaries of {held_back} more; "
        f"all_reduces per rank during the "
        f"{strangers_done - t_first:.2f}s of strangers: {during}, in the 1 s after: {after}"
    )
    problems = [f"rank {r}: {w}" for r, res in enumerate(results) for w in res["wrong"]]
    problems += not_closed
    flood_open = [o for o in flood_outcomes if o != "closed"]
    if flood_open:
        problems.append(f"{len(flood_open)} of {flood} flood connections not closed: {flood_open[:3]}")
    if len(dropped) + held_back < n_strangers:
        problems.append(
            f"rank 0 logged {len(dropped)} 'dropped connection from' warnings and held back {held_back} "
            f"for {n_strangers} strangers:\n{log0[-3000:]}"
        )
    if len(dropped) > 25 * (strangers_done + 1.1 - t_first + 2):
        problems.append(f"rank 0 logged {len(dropped)} warnings: not rate-limited")
    if min(during) < 3 or min(after) < 3:
        problems.append(
            f"the group barely ran with the strangers (all_reduces per rank during: {during}, "
            f"after: {after})"
        )
    assert not problems, "\n".join(problems)


def _delay_rank1_backend(rank: int) -> None:
    """Runs before init_process_group: rank 1 creates its pycomm backend 4 s late, so rank 0
    sits in its accept loop (it listens and has published its address) meanwhile."""
    if rank != 1:
        return
    plugin = dist.Backend._plugins["PYCOMM"]
    create = plugin.creator_fn

    def late_create(*args: Any, **kwargs: Any) -> Any:
        time.sleep(4.0)
        return create(*args, **kwargs)

    dist.Backend._plugins["PYCOMM"] = plugin._replace(creator_fn=late_create)



def test_strangers_during_setup_are_dropped_and_group_forms(pycomm: ModuleType) -> None:
    with Cluster(
        formed_worker, 2, pg_timeout_s=30, hang_timeout_s=120, before_init=_delay_rank1_backend
    ) as c:
        address = c.pycomm_address(0, timeout=60)  # rank 0 is accepting; rank 1 is asleep
        token = c.store().get(c.store_key("pycomm/token"))
        held = {  # connections that never complete a handshake, kept open past setup
            "silent": socket.create_connection(address, timeout=5),
            "truncated_hello": socket.create_connection(address, timeout=5),
        }
        nonce = read_challenge(held["truncated_hello"], 5.0)
        assert nonce is not None, "rank 0 closed a connection at once during setup"
        held["truncated_hello"].sendall(hello_for(token, nonce, 1, 0)[:20])
        outcomes: dict[str, str] = {}
        for name, payload in stranger_payloads(token).items():
            outcomes[name] = stranger(address, payload)
        send_and_close(address, CHALLENGE_PREFIX + b"\x01\x00\x00")  # 11 bytes of a hello, then gone
        rank1_keys = [k for k in c.store().list_keys() if k.endswith("pycomm/addr/1")]
        assert not rank1_keys, (
            "rank 1 published its address before the strangers were done: the 4 s delay was "
            "too short on this machine, so this case did not test setup"
        )
        for rank in range(2):
            c.wait_event(rank, "formed", timeout=60)
        held_outcomes = {name: await_close(s, 4.0) for name, s in held.items()}
        for s in held.values():
            s.close()
        for rank in range(2):
            c.send(rank, "done")
        results = [c.result(r, timeout=60) for r in range(2)]
        log0 = c.stderr(0)

    dropped = dropped_lines(log0)
    report(
        f"strangers during setup: outcomes {outcomes}, held {held_outcomes}; rank 0 warnings:\n  "
        + "\n  ".join(line[line.find("dropped"):][:150] for line in dropped)
    )
    problems = [f"rank {r}: wrong all_reduce result" for r, res in enumerate(results) if not res["ok"]]
    problems += [f"stranger {k}: {v} (expected closed)" for k, v in outcomes.items() if v != "closed"]
    problems += [
        f"held {k}: {v} after setup (expected closed)" for k, v in held_outcomes.items() if v != "closed"
    ]
    expected_reasons = {
        "not a pycomm handshake": 4,  # garbage, both frame headers (wrong magic), http
        "wrong group token": 1,
        "handshake version 1,": 1,
        "claims to be rank 7": 1,
        "addressed to rank 5": 1,
        "handshake version 9,": 1,
        "closed before completing the handshake": 1,
    }
    for reason, count in expected_reasons.items():
        seen = sum(reason in line for line in dropped)
        if seen < count:
            problems.append(f"rank 0 logged {seen} drops for {reason!r}, expected {count}")
    # The two held open are dropped at their handshake deadline (2.5 s) or, if rank 1 comes
    # first, when the group is complete.
    held_drops = sum(
        "no handshake within" in line or "no handshake before the group was complete" in line for line in dropped
    )
    if held_drops < 2:
        problems.append(f"rank 0 logged {held_drops} drops of the connections held open, expected 2")
    if problems:
        problems.append(f"rank 0 stderr:\n{log0[-4000:]}")
    assert not problems, "\n".join(problems)


# Each rank listens on the interface that reaches the rendezvous host, never the wildcard.


def _decode_proc_address(text: str) -> tuple[str, int]:
    """An address of /proc/net/tcp{,6} ("0100007F:1F90") as ("127.0.0.1", 8080)."""
    host_hex, port_hex = text.split(":")
    raw = bytes.fromhex(host_hex)
    if len(raw) == 4:
        host = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:  # four 32-bit words, each in host (little-endian) order
        words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        host = socket.inet_ntop(socket.AF_INET6, words)
    return host, int(port_hex, 16)


def _own_listening_sockets() -> list[tuple[str, int]]:
    """(address, port) of every TCP socket this process has in LISTEN state."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    found.append(_decode_proc_address(fields[1]))
    return found


def _listening_worker(rank: int, world: int, ctl: Control) -> None:
    extra = dist.new_group(backend="pycomm")  # a second pycomm group: a second listener
    for group in (None, extra):
        t = torch.ones(4)
        dist.all_reduce(t, group=group)
        assert t.tolist() == [float(world)] * 4
    ctl.event("ready", {"pid": os.getpid(), "listening": _own_listening_sockets()})
    assert ctl.command() == "done"


_WILDCARDS = ("0.0.0.0", "::")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_listening_sockets_bind_to_loopback(pycomm: ModuleType, host: str) -> None:
    world = 2
    with Cluster(_listening_worker, world, host=host, hang_timeout_s=90) as c:
        info = [c.wait_event(rank, "ready", timeout=60) for rank in range(world)]
        keys = c.store().list_keys()
        published = {
            rank: [c.store().get(k).decode() for k in keys if k.endswith(f"pycomm/addr/{rank}")]
            for rank in range(world)
        }
        ss_lines = ""
        if shutil.which("ss"):
            ss_lines = subprocess.run(
                ["ss", "-ltnpH"], capture_output=True, text=True, timeout=10, check=False
            ).stdout
        for rank in range(world):
            c.send(rank, "done")
        for rank in range(world):
            c.result(rank, timeout=30)

    problems = []
    for rank in range(world):
        listening = info[rank]["listening"]
        pid = info[rank]["pid"]
        report(f"rank {rank} (init via tcp://{host}): published {published[rank]}, listens on {listening}")
        if len(published[rank]) != 2:
            problems.append(f"rank {rank}: expected 2 published pycomm addresses, got {published[rank]}")
        for value in published[rank]:
            addr, _, port = value.rpartition(":")
            if addr != "127.0.0.1":
                problems.append(f"rank {rank}: publishes {value}, not a 127.0.0.1 address")
            if (addr, int(port)) not in listening:
                problems.append(f"rank {rank}: no LISTEN socket on {value}; it has {listening}")
        for addr, port in listening:
            if addr in _WILDCARDS and not (rank == 0 and port == c.port):
                problems.append(f"rank {rank}: LISTEN socket on the wildcard {addr}:{port}")
        own_ss = [line for line in ss_lines.splitlines() if f"pid={pid}," in line]
        if ss_lines and len(own_ss) < len(listening):
            problems.append(f"rank {rank}: ss -ltnp lists {len(own_ss)} of its {len(listening)} listeners")
        for line in own_ss:
            local = line.split()[3]
            addr, _, port = local.rpartition(":")
            addr = addr.strip("[]").split("%")[0]
            if addr in ("*", *_WILDCARDS) and not (rank == 0 and int(port) == c.port):
                problems.append(f"rank {rank}: ss shows a wildcard listener: {line.strip()}")
    assert not problems, "\n".join(problems)
