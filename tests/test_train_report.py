"""The trainer's large model and its run report: exposed comm time, bytes on the wire, loss curves.

The CLI runs in subprocesses with timeouts (a hung collective fails the test, not the CI run), at
world 2 and 2 steps: the large model (tens of millions of parameters) costs ~15 s a run on 2
cores. The byte counts are checked against what the algorithm must send: at world 2 an
uncompressed all-reduce sends 2(p-1)/p = 1 times the gradient per rank, fp16 half that. Those runs
set PYCOMM_TRANSPORT=tcp, so the all-reduce goes through (loopback) sockets as it would between
hosts; on one host pycomm would otherwise run it as a shared-memory collective, which no wire
counter sees.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_runs import HAVE_MATPLOTLIB, assert_exit_0, plot_args, run_python, source_root, train_to_json
from support import import_pycomm_or_skip

_pycomm = import_pycomm_or_skip("python -m pycomm.train")

SOURCE_ROOT = source_root(_pycomm)
TIMEOUT_S = 150  # per run; a 2-step large-model run takes ~15 s on 2 idle cores
STEPS = 2


def train(log: Path, *args: str, transport: str | None = None) -> dict[str, Any]:
    env = {"PYCOMM_TRANSPORT": transport} if transport else {}
    return train_to_json(SOURCE_ROOT, log, args, timeout_s=TIMEOUT_S, env=env)


LARGE = ["--model", "large", "--nproc", "2", "--steps", str(STEPS), "--eval-every", "0"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("train-report")


@pytest.fixture(scope="module")
def large_fp32(workdir: Path) -> dict[str, Any]:
    return train(workdir / "fp32.json", *LARGE, *plot_args(workdir / "large.png"), transport="tcp")


@pytest.fixture(scope="module")
def large_fp16(workdir: Path) -> dict[str, Any]:
    return train(workdir / "fp16.json", *LARGE, "--hook", "fp16", transport="tcp")


def test_large_model_has_tens_of_millions_of_parameters(large_fp32: dict[str, Any]) -> None:
    config = large_fp32["config"]
    assert config["model"] == "large" and config["hash_buckets"] > 0
    assert 10_000_000 <= config["parameters"] < 100_000_000
    assert large_fp32["wire"]["gradient_bytes"] == 4 * config["parameters"]


def test_loss_curves_have_one_point_per_step(large_fp32: dict[str, Any]) -> None:
    assert len(large_fp32["train_loss"]) == STEPS
    assert [entry["step"] for entry in large_fp32["val_loss"]] == [0, STEPS]
    assert large_fp32["train_loss"][-1] < large_fp32["train_loss"][0]


def test_exposed_comm_time(large_fp32: dict[str, Any]) -> None:
    doc = large_fp32
    exposed, steps = doc["exposed_comm_s"], doc["step_time_by_rank_s"]
    assert len(exposed) == len(steps) == 2 and all(len(rank) == STEPS for rank in exposed)
    for rank_exposed, rank_steps in zip(exposed, steps):
        assert all(0 <= e <= s for e, s in zip(rank_exposed, rank_steps))
    assert doc["step_time_by_rank_s"][0] == doc["step_time_s"]  # rank 0's row is the old field
    assert 0 <= doc["exposed_comm_share"] < 1 and doc["exposed_comm_per_step_s"] >= 0
    assert doc["exposed_comm_total_s"] == pytest.approx(doc["exposed_comm_per_step_s"] * doc["timed_steps"])
    assert doc["exposed_comm_method"]
    assert "exposed comm" in doc["_stdout"] and "bytes per step and rank" in doc["_stdout"]


def _sent_ratio(doc: dict[str, Any]) -> tuple[float, float]:
    """(socket bytes sent, payload bytes sent) per step and rank, over the fp32 gradient's bytes."""
    wire = doc["wire"]
    assert wire["counted"] is True
    world = doc["config"]["world_size"]
    expected = 2 * (world - 1) / world * wire["gradient_bytes"]  # ring all-reduce, per rank
    for field in ("socket_sent", "payload_sent"):
        by_rank = wire["by_rank"][field]
        assert len(by_rank) == world and all(len(steps) == STEPS for steps in by_rank)
        assert all(b > 0 for steps in by_rank for b in steps)
    assert wire["total"]["socket_sent"] == sum(sum(steps) for steps in wire["by_rank"]["socket_sent"])
    per_step = wire["per_step_and_rank"]
    return per_step["socket_sent"] / expected, per_step["payload_sent"] / expected


def test_fp32_bytes_on_the_wire(large_fp32: dict[str, Any]) -> None:
    socket, payload = _sent_ratio(large_fp32)
    # Frame headers add a little to the sockets' count; the payload is exact for a ring.
    assert 1.0 <= socket < 1.01, socket
    assert payload == pytest.approx(1.0, rel=1e-3)
    assert large_fp32["wire"]["per_step_and_rank"]["shm_ring_sent"] == 0


def test_fp16_sends_half(large_fp16: dict[str, Any], large_fp32: dict[str, Any]) -> None:
    socket, payload = _sent_ratio(large_fp16)
    assert 0.5 <= socket < 0.51, socket
    assert payload == pytest.approx(0.5, rel=1e-3)
    # The same batches and weights: fp16's first loss (before any update) is fp32's.
    assert large_fp16["train_loss"][0] == large_fp32["train_loss"][0]


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="matplotlib not installed")
def test_report_plot_written(large_fp32: dict[str, Any], workdir: Path) -> None:
    png = workdir / "large.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000


def test_gloo_run_reports_no_counters(workdir: Path) -> None:
    doc = train(workdir / "gloo.json", "--backend", "gloo", "--steps", "2", "--eval-every", "0")
    assert doc["wire"]["counted"] is False
    assert doc["wire"]["per_step_and_rank"]["socket_sent"] == 0
    assert "not counted over gloo" in doc["_stdout"]


def test_convergence_script_tiny(workdir: Path) -> None:
    # The small model: the large one's runs are checked above, and two of them
    # more would double this file's time. Two runs: the reference and one other.
    out = workdir / "convergence"
    proc = run_python(
        SOURCE_ROOT,
        ["benchmarks/convergence.py", "--model", "small", "--steps", "2", "--eval-every", "0",
         "--runs", "fp8+ef,none", "--out", str(out)],
        timeout_s=2 * TIMEOUT_S,
    )
    assert_exit_0(proc)
    doc = json.loads((out / "convergence.json").read_text())
    assert doc["schema"] == "pycomm.convergence/1" and doc["steps"] == 2 and doc["world_size"] == 2
    assert doc["model"] == "small"
    assert [r["run"] for r in doc["rows"]] == ["none", "fp8+ef"]  # fp32 first, the reference
    fp8 = doc["rows"][1]
    assert fp8["error_feedback"] is True and fp8["hook"] == "fp8"
    assert 0.9 < fp8["val_ratio_to_fp32"] < 1.1 and 0.9 < fp8["train_ratio_to_fp32"] < 1.1
    assert all(len(run["train_loss"]) == 2 for run in doc["runs"].values())
    assert "| fp8+ef |" in proc.stdout
    if HAVE_MATPLOTLIB:
        assert (out / "convergence.png").stat().st_size > 5_000


# In-process checks: the hashed n-grams, the batch seeds, the presets.


def test_ngram_ids_in_range_and_deterministic() -> None:
    import torch

    from pycomm.train.ngram import START, ngram_ids

    idx = torch.randint(0, 256, (3, 17), generator=torch.Generator().manual_seed(0))
    ids = ngram_ids(idx, 1000)
    assert ids.shape == (2, 3, 17) and ids.dtype == torch.int64
    assert int(ids.min()) >= 0 and int(ids.max()) < 1000
    assert torch.equal(ids, ngram_ids(idx.clone(), 1000))
    # The bigram at position 0 is (START, byte): the same as at a later position only by collision.
    same = torch.tensor([[7, 7, 7]])
    bigrams = ngram_ids(same, 1 << 20)[0, 0]
    assert bigrams[1] == bigrams[2] and bigrams[0] != bigrams[1]
    # Each n-gram depends only on its own bytes: changing the last byte leaves earlier ids alone.
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 256
    assert torch.equal(ngram_ids(changed, 1000)[:, :, :-1], ids[:, :, :-1])
    assert START == 256


def test_batches_are_a_function_of_seed_rank_and_step() -> None:
    import torch

    from pycomm.train import data

    tokens = torch.arange(10_000, dtype=torch.int64).to(torch.uint8)
    a = data.train_batch(tokens, 4, 16, seed=3, rank=1, step=5)
    b = data.train_batch(tokens, 4, 16, seed=3, rank=1, step=5)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    seeds = {data.batch_seed(s, r, t) for s in (0, 1) for r in (0, 1, 2) for t in (0, 1, 2)}
    assert len(seeds) == 18 and all(0 <= s < 1 << 63 for s in seeds)


def test_presets() -> None:
    from pycomm.train.config import MODELS, TrainConfig

    small = TrainConfig.for_model("small")
    assert small == TrainConfig()  # the small preset is the original, default, config
    large = TrainConfig.for_model("large", batch_size=5)
    assert large.batch_size == 5 and large.d_model == MODELS["large"].d_model
    assert TrainConfig.for_model("large").batch_size == MODELS["large"].batch_size
    with pytest.raises(ValueError, match="unknown model"):
        TrainConfig.for_model("huge")
