"""Real multi-host runs: "hosts" are network namespaces with their own addresses on a bridge.

Two hosts of two ranks each: all-reduce is hierarchical (shared memory inside a host, TCP across),
and every result is checked against a float64 reference; the compressed collectives are then
hierarchical too (full precision inside a host, compression across). Needs root for the namespaces; skipped
with the reason otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from netns import Testbed, available  # noqa: E402

WORKER = Path(__file__).with_name("multihost_worker.py")
TIMEOUT_S = 180


@pytest.mark.skipif(available() is not None, reason=f"network namespaces unavailable: {available()}")
@pytest.mark.parametrize("hosts,per_host", [(2, 2), (2, 1)])
def test_hosts_in_namespaces(hosts: int, per_host: int) -> None:
    world = hosts * per_host
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYCOMM_SOCKET_IFNAME="eth0")
    with Testbed(hosts=hosts) as bed:
        procs = []
        for rank in range(world):
            host = rank // per_host
            argv = [sys.executable, str(WORKER), "--rank", str(rank), "--world", str(world),
                    "--master", bed.address(0), "--port", "29811"]
            procs.append(bed.popen(host, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outputs = []
        try:
            for proc in procs:
                outputs.append(proc.communicate(timeout=TIMEOUT_S))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
    for rank, (proc, (_, err)) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{err[-3000:]}"
    if per_host > 1:
        assert "hierarchical" in outputs[0][1], "expected the hierarchical all-reduce:\n" + outputs[0][1][-2000:]
        assert "hierarchical-compressed" in outputs[0][1], "expected compression across hosts only:\n" + outputs[0][1][-2000:]
