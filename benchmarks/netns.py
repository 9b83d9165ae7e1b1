"""A testbed of "hosts" made of network namespaces on this machine, for multi-host runs and tests.

Each host is a namespace with one veth whose other end sits on a bridge in the root namespace;
hosts get addresses 10.231.<net>.<1 + i>/24 that exist only inside this testbed. An optional rate
(e.g. "1gbit") shapes every host's egress with a token bucket filter, so a link between two hosts
is that fast each way. Needs root (ip, tc). Everything is removed on exit, also after errors.

    with Testbed(hosts=2, rate="1gbit") as bed:
        proc = bed.popen(0, ["python3", "-c", "..."])
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from types import TracebackType


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def available() -> str | None:
    """None if namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the '{tool}' tool is missing (Debian package iproute2)"
    probe = f"pcprobe{uuid.uuid4().hex[:6]}"
    try:
        _run("ip", "netns", "add", probe)
    except subprocess.CalledProcessError as error:
        return f"cannot create a network namespace: {error.stderr.strip()}"
    _run("ip", "netns", "del", probe)
    return None


class Testbed:
    __test__ = False  # not a pytest test class, though test modules import it

    def __init__(self, hosts: int = 2, rate: str | None = None, net: int | None = None) -> None:
        self.hosts = hosts
        self.rate = rate
        tag = uuid.uuid4().hex[:5]
        self.net = net if net is not None else 100 + int(tag, 16) % 150
        self.bridge = f"pcbr{tag}"
        self.namespaces = [f"pch{tag}{i}" for i in range(hosts)]
        self._created: list[tuple[str, ...]] = []

    def address(self, host: int) -> str:
        return f"10.231.{self.net}.{1 + host}"

    def up(self) -> Testbed:
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            self._created.append(("ip", "link", "del", self.bridge))
            _run("ip", "link", "set", self.bridge, "up")
            for i, ns in enumerate(self.namespaces):
                _run("ip", "netns", "add", ns)
                self._created.append(("ip", "netns", "del", ns))
                outer, inner = f"{self.bridge}v{i}", "eth0"
                _run("ip", "link", "add", outer, "type", "veth", "peer", "name", f"{self.bridge}p{i}")
                self._created.append(("ip", "link", "del", outer))
                _run("ip", "link", "set", f"{self.bridge}p{i}", "netns", ns)
                _run("ip", "netns", "exec", ns, "ip", "link", "set", f"{self.bridge}p{i}", "name", inner)
                _run("ip", "link", "set", outer, "master", self.bridge)
                _run("ip", "link", "set", outer, "up")
                _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.address(i)}/24", "dev", inner)
                _run("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
                _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
                if self.rate:
                    _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", inner, "root", "tbf",
                         "rate", self.rate, "burst", "256kb", "latency", "50ms")
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        # Processes left inside a host would keep its namespace alive; end them first.
        for ns in self.namespaces:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                subprocess.run(["kill", "-9", pid], capture_output=True)
        for argv in reversed(self._created):
            subprocess.run(argv, capture_output=True)
        self._created.clear()

    def command(self, host: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[host], *argv]

    def popen(self, host: int, argv: list[str], env: dict[str, str] | None = None, **kwargs: object) -> subprocess.Popen:
        return subprocess.Popen(self.command(host, argv), env=env, **kwargs)  # type: ignore[call-overload]

    def __enter__(self) -> Testbed:
        return self.up()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.down()
