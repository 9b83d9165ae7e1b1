"""benchmarks/host_probe.c, the probe `benchmarks/peers.py --probe` runs around every launch: it
measures, checks what it moved, and refuses what it cannot do instead of hanging the benchmark."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parent.parent / "benchmarks" / "host_probe.c"


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    binary = tmp_path_factory.mktemp("probe") / "host_probe"
    subprocess.run([compiler, "-O2", "-Wall", "-Werror", "-o", str(binary), str(PROBE)], check=True)
    return binary


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("nbytes", [2, 4098, 65536])
def test_probe_measures_an_exchange(probe: Path, transport: str, nbytes: int) -> None:
    out = subprocess.run([str(probe), str(nbytes), "50", "3", transport], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) > 0


@pytest.mark.parametrize("args", [["33554432", "1", "1", "tcp"], ["0"], ["-4"], ["65536", "0"], ["65536", "1", "65"],
                                  ["65536", "1", "1", "udp"]])
def test_probe_refuses_what_it_cannot_do(probe: Path, args: list[str]) -> None:
    # 32 MiB over TCP: both processes would block in send() for good, neither receiving.
    out = subprocess.run([str(probe), *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "usage" in out.stderr
