"""The benchmark CLI (``python -m pycomm.bench``), run as a user would.

Most tests start the CLI in a subprocess with tiny sizes and a short time
budget, so they check plumbing (flags, table, JSON, plot, exit codes, the
``wrong`` count), not performance. The bench lives inside the pycomm package,
so ``import pycomm`` must work for any of this to run; if it does not, the
module follows the suite's policy (tests/conftest.py): an error, or a skip
with PYCOMM_ALLOW_SKIP=1.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
from pathlib import Path

import pytest
from cli_runs import run_python, source_root
from support import import_pycomm_or_skip

_pycomm = import_pycomm_or_skip("python -m pycomm.bench")

# Imported only now: the policy above decides what a broken pycomm means.
from pycomm.bench import cli, data, descriptors, sizes
from pycomm.bench.descriptors_names import OP_NAMES

# Run the CLI from the tree pytest imported pycomm from (a source checkout
# or an install), whatever the current directory is.
assert _pycomm.__file__ is not None, "pycomm must be a regular package (with __init__.py)"
SOURCE_ROOT = source_root(_pycomm)
TIMEOUT_S = 240  # per CLI run; generous for a loaded 2-core CI machine

COLUMNS = ["size", "count", "type", "op", "backend", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "wrong", "ratio"]
ROW_KEYS = {
    "op",
    "backend",
    "algo",
    "compression",
    "dtype",
    "size_bytes",
    "count",
    "time_us",
    "algbw_GBps",
    "busbw_GBps",
    "wrong",
    "ratio_vs_first",
}
META_KEYS = {"command", "world_size", "host", "torch_version", "date"}

# Keep CLI runs short: the tests check plumbing, not bandwidth.
FAST = ["--target-time", "0.02", "--warmup", "2", "--reps", "3"]


def _pycomm_backend_available() -> bool:
    import torch.distributed as dist

    return hasattr(_pycomm, "Options") and "pycomm" in dist.Backend.backend_list


def _matplotlib_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


BACKEND_CASES = [
    pytest.param("gloo", id="gloo"),
    pytest.param(
        "pycomm,gloo",
        id="pycomm-gloo",
        marks=pytest.mark.skipif(not _pycomm_backend_available(), reason="pycomm backend not available"),
    ),
]


def run_bench(*args: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return run_python(SOURCE_ROOT, ["-m", "pycomm.bench", *args], timeout_s=timeout)


def header_and_rows(stdout: str) -> tuple[list[str], list[list[str]]]:
    """The column header (names) and the data rows (cells) of the table."""
    header: list[str] | None = None
    rows: list[list[str]] = []
    for line in stdout.splitlines():
        if line.startswith("#"):
            words = line.lstrip("#").split()
            if words[:2] == ["size", "count"]:
                header = words
        elif line.strip():
            rows.append(line.split())
    assert header is not None, f"no header in:\n{stdout}"
    return header, rows


def assert_one_line_error(proc: subprocess.CompletedProcess[str]) -> None:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected a one-line error, got:\n{proc.stderr}"
    assert "error" in lines[0]


# -- full runs ---------------------------------------------------------------


@pytest.mark.parametrize("backends", BACKEND_CASES)
def test_sweep_table_and_json(backends: str, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = run_bench("--sizes", "4K:16K", "--backends", backends, "--nproc", "2", "--json", str(out), *FAST)
    assert proc.returncode == 0, proc.stderr + proc.stdout

    header, rows = header_and_rows(proc.stdout)
    assert header == COLUMNS
    labels = backends.split(",")
    assert len(rows) == 3 * len(labels)  # 4K, 8K, 16K
    for cells in rows:
        assert len(cells) == len(COLUMNS), cells
        assert cells[3] == "all_reduce" and cells[2] == "float32"
        assert cells[4] in labels
        assert cells[8] == "0", f"wrong elements: {cells}"
        assert float(cells[5]) > 0 and float(cells[7]) > 0
    assert [r[9] for r in rows if r[4] == labels[0]] == ["1.00"] * 3

    doc = json.loads(out.read_text())
    assert META_KEYS <= doc["meta"].keys()
    assert doc["meta"]["world_size"] == 2
    assert [r["size_bytes"] for r in doc["rows"] if r["backend"] == labels[0]] == [4096, 8192, 16384]
    for row in doc["rows"]:
        assert ROW_KEYS <= row.keys()
        assert row["wrong"] == 0
        assert row["error"] is None
        assert row["time_us"] > 0 and row["busbw_GBps"] > 0
        # world 2 all_reduce: busbw = algbw * 2(p-1)/p = algbw
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"])
        assert row["algbw_GBps"] == pytest.approx(row["size_bytes"] / row["time_us"] / 1e3)
    assert all(r["ratio_vs_first"] == 1.0 for r in doc["rows"] if r["backend"] == labels[0])


def test_all_ops_three_ranks(tmp_path: Path) -> None:
    """Every descriptor's expected result matches gloo on an odd world size
    (uneven chunking) and a type with a small exact range."""
    out = tmp_path / "all.json"
    proc = run_bench(
        "--op", "all", "--sizes", "4K:8K", "--nproc", "3", "--backends", "gloo", "--dtype", "bfloat16",
        "--json", str(out), "--target-time", "0.01", "--warmup", "1", "--reps", "1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr + proc.stdout
    doc = json.loads(out.read_text())
    assert doc["meta"]["world_size"] == 3
    assert sorted({r["op"] for r in doc["rows"]}) == sorted(OP_NAMES)
    assert len(doc["rows"]) == 2 * len(OP_NAMES)
    for row in doc["rows"]:
        assert row["wrong"] == 0, row
        assert row["dtype"] == "bfloat16"
    # nccl-tests sizing: sharded ops round down to a multiple of world * elem
    # (bfloat16, world 3: 4096 -> 3 x 682 x 2 bytes) and count the shard.
    for row in doc["rows"]:
        if row["op"] in ("all_gather", "reduce_scatter", "alltoall"):
            assert (row["size_bytes"], row["count"]) in ((4092, 682), (8190, 1365)), row
        else:
            assert (row["size_bytes"], row["count"]) in ((4096, 2048), (8192, 4096)), row


def test_no_check_reports_na(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = run_bench("--sizes", "4K", "--backends", "gloo", "--no-check", "--json", str(out), *FAST)
    assert proc.returncode == 0, proc.stderr
    _, rows = header_and_rows(proc.stdout)
    assert [cells[8] for cells in rows] == ["N/A"]
    assert json.loads(out.read_text())["rows"][0]["wrong"] is None


@pytest.mark.skipif(not _matplotlib_available(), reason="matplotlib not installed")
def test_plot_written(tmp_path: Path) -> None:
    png = tmp_path / "busbw.png"
    proc = run_bench("--sizes", "4K:8K", "--backends", "gloo,gloo", "--plot", str(png), *FAST)
    assert proc.returncode == 0, proc.stderr
    raw = png.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", raw[16:24])
    assert width > 100 and height > 100


def test_plot_without_matplotlib_exits_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Checked before any rank starts; matplotlib is simulated missing."""
    from pycomm.bench import plot

    monkeypatch.setattr(plot, "matplotlib_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--backends", "gloo", "--plot", "out.png"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install matplotlib" in err


# -- failures ----------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--bogus"],
        ["--op", "all_reduce,nope"],
        ["--sizes", "4Q"],
        ["--sizes", "64M:4K"],
        ["--factor", "1"],
        ["--dtype", "float8"],
        ["--nproc", "0"],
        ["--iters", "x"],
        ["--json", "/nonexistent-dir/r.json"],
    ],
    ids=lambda a: " ".join(a),
)
def test_bad_flag_exits_2_with_one_line(args: list[str]) -> None:
    proc = run_bench(*args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert_one_line_error(proc)


def test_unknown_backend_fails_clearly() -> None:
    proc = run_bench("--sizes", "4K", "--backends", "nosuchbackend", *FAST, timeout=120)
    assert proc.returncode not in (0, 2)
    assert "nosuchbackend" in proc.stderr


# -- pieces (in process, no ranks) -------------------------------------------


def test_op_names_match_descriptors() -> None:
    assert tuple(descriptors.COLLECTIVES) == OP_NAMES


def test_size_parsing_and_sweep() -> None:
    assert sizes.parse_size("4K") == 4096
    assert sizes.parse_size("64MiB") == 64 << 20
    assert sizes.parse_size_range("4K:64M") == (4096, 64 << 20)
    assert sizes.parse_size_range("1M") == (1 << 20, 1 << 20)
    default = sizes.sweep(4 << 10, 64 << 20, 2)
    assert default[0] == 4096 and default[-1] == 64 << 20 and len(default) == 15
    with pytest.raises(ValueError):
        sizes.parse_size("-1")


@pytest.mark.parametrize(
    ("op", "world", "factor"),
    [
        ("all_reduce", 4, 1.5),
        ("all_gather", 4, 0.75),
        ("reduce_scatter", 4, 0.75),
        ("alltoall", 4, 0.75),
        ("broadcast", 4, 1.0),
        ("reduce", 4, 1.0),
        ("sendrecv", 4, 1.0),
    ],
)
def test_busbw_factors_follow_nccl_tests(op: str, world: int, factor: float) -> None:
    assert descriptors.COLLECTIVES[op].busbw_factor(world) == pytest.approx(factor)


def test_layouts_follow_nccl_tests() -> None:
    coll = descriptors.COLLECTIVES
    # all_gather: size is the gathered output; count the per-rank shard.
    ag = coll["all_gather"].layout(4096, 4, 3)
    assert ag is not None and (ag.size_bytes, ag.count, ag.in_count, ag.out_count) == (4092, 341, 341, 1023)
    rs = coll["reduce_scatter"].layout(4096, 4, 3)
    assert rs is not None and (rs.size_bytes, rs.count, rs.in_count, rs.out_count) == (4092, 341, 1023, 341)
    ar = coll["all_reduce"].layout(4096, 2, 3)
    assert ar is not None and (ar.size_bytes, ar.count) == (4096, 2048)
    assert coll["alltoall"].layout(8, 4, 3) is None  # less than one element per rank


def test_check_counts_exact_mismatches() -> None:
    import torch

    period = data.pattern_period(torch.bfloat16, 3)
    assert period * 3 <= 256  # sums stay exact in bfloat16
    layout = descriptors.COLLECTIVES["all_reduce"].layout(4096, 2, 3)
    assert layout is not None
    expected = descriptors.COLLECTIVES["all_reduce"].expected(layout, 0, 3, period)
    assert expected is not None
    result = expected.to(torch.bfloat16)
    assert data.count_wrong(result, expected) == 0
    result[7] += 1
    result[100] = float("nan")
    assert data.count_wrong(result, expected) == 2


def test_check_data_is_exact_in_cast_codecs() -> None:
    """With fp16/bf16 on the wire the check data must still sum exactly, so a
    wrong element from those codecs is a bug; unknown codecs are excused."""
    import torch

    from pycomm.bench.config import build_variants

    for world in (2, 3, 8):
        period = data.pattern_period(torch.float32, world, ["bf16", None])
        assert period * world <= 256
    assert data.pattern_period(torch.float32, 2, ["fp8_e4m3"]) == data.pattern_period(torch.float32, 2)
    variants = build_variants(["pycomm", "gloo"], ["ring"], ["none", "bf16", "fp8_e4m3"], None, None)
    assert [v.label for v in variants] == ["pycomm/ring+none", "pycomm/ring+bf16", "pycomm/ring+fp8_e4m3", "gloo"]
    assert [v.exact for v in variants] == [True, True, False, True]
