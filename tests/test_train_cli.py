"""The trainer CLI (``python -m pycomm.train``), run as a user would.

Each test starts the CLI in a subprocess (with a timeout: a hung collective
must fail the test, not the CI run). Runs are small and few, and shared through
module-scoped fixtures, so the file takes about a minute on 2 cores. The
trainer lives inside the pycomm package, so ``import pycomm`` must work; if it
does not, the module follows the suite's policy (tests/conftest.py): an error,
or a skip with PYCOMM_ALLOW_SKIP=1.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cli_runs import HAVE_MATPLOTLIB, plot_args, run_python, source_root, train_to_json
from support import import_pycomm_or_skip

_pycomm = import_pycomm_or_skip("python -m pycomm.train")

SOURCE_ROOT = source_root(_pycomm)
TIMEOUT_S = 180  # per run; generous for a loaded 2-core CI machine (a 30-step run takes ~20 s)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def have_pycomm_hooks() -> bool:
    if getattr(_pycomm, "hooks", None) is not None:
        return True
    return importlib.util.find_spec("pycomm.hooks") is not None


def run_cli(*args: str, launcher: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """``python [launcher...] -m pycomm.train args...``; launcher is e.g. torchrun's module and flags."""
    return run_python(SOURCE_ROOT, [*launcher, "-m", "pycomm.train", *args], timeout_s=TIMEOUT_S)


def train(tmp: Path, name: str, *args: str) -> dict[str, Any]:
    """Run the trainer to completion and return its JSON log."""
    return train_to_json(SOURCE_ROOT, tmp / f"{name}.json", args, timeout_s=TIMEOUT_S)


def first_line_of_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{proc.stderr}"
    return lines[0]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("train")


@pytest.fixture(scope="module")
def long_run(workdir: Path) -> dict[str, Any]:
    """30 steps at world 2 over pycomm, with the plot when matplotlib is there."""
    return train(workdir, "long", "--backend", "pycomm", "--nproc", "2", "--steps", "30", "--eval-every", "10",
                 *plot_args(workdir / "loss.png"))


# Short runs: over pycomm twice (determinism), over gloo, and under torchrun.
SHORT_BASE = ["--steps", "5", "--seed", "7", "--eval-every", "5"]
SHORT = [*SHORT_BASE, "--hook", "fp16"]


@pytest.fixture(scope="module")
def short_runs(workdir: Path) -> list[dict[str, Any]]:
    """Two identical 5-step runs at world 2 over pycomm with the fp16 hook, and one over gloo."""
    return [
        train(workdir, "short-a", "--backend", "pycomm", "--nproc", "2", *SHORT),
        train(workdir, "short-b", "--backend", "pycomm", "--nproc", "2", *SHORT),
        train(workdir, "short-gloo", "--backend", "gloo", "--nproc", "2", *SHORT),
    ]


def test_import_pycomm_in_a_fresh_interpreter() -> None:
    # Everything below runs `python -m pycomm.train`, which imports pycomm
    # before anything else; this names that cause once instead of in every test.
    proc = run_python(SOURCE_ROOT, ["-c", "import pycomm"], timeout_s=TIMEOUT_S)
    assert proc.returncode == 0, f"`python -c 'import pycomm'` fails:\n{proc.stderr}"


def test_train_loss_falls_over_30_steps(long_run: dict[str, Any]) -> None:
    losses = long_run["train_loss"]
    assert len(losses) == 30
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    # Untrained, the loss is about ln(256) = 5.55 nats per byte; 30 steps of
    # AdamW bring it near 3. Asking for a drop of 1 nat leaves room for noise.
    assert first - last > 1.0, f"mean of first 5 losses {first:.3f}, of last 5 {last:.3f}"
    val = [entry["loss"] for entry in long_run["val_loss"]]
    assert val[-1] < val[0] - 1.0, f"validation loss did not fall: {val}"


def test_json_schema(long_run: dict[str, Any]) -> None:
    doc = long_run
    assert doc["schema"] == "pycomm.train/1"
    config = doc["config"]
    assert config["backend"] == "pycomm" and config["hook"] == "none"
    assert config["world_size"] == 2 and config["steps"] == 30 and config["batch_size"] >= 1
    assert config["hook_impl"] == "torch.allreduce_hook"
    # The default model is the small preset, the trainer's original model.
    assert config["model"] == "small" and config["parameters"] == 136_960 and config["batch_size"] == 8
    corpus = config["corpus"]
    assert corpus["train_tokens"] > corpus["val_tokens"] > 0 and len(corpus["sha256"]) == 64
    # Train loss per step: finite numbers, one per step.
    assert all(isinstance(x, float) and math.isfinite(x) for x in doc["train_loss"])
    # Validation before training and every 10 steps.
    assert [entry["step"] for entry in doc["val_loss"]] == [0, 10, 20, 30]
    assert all(math.isfinite(entry["loss"]) for entry in doc["val_loss"])
    assert len(doc["step_time_s"]) == len(doc["comm_time_s"]) == 30
    assert all(0 <= comm <= step for comm, step in zip(doc["comm_time_s"], doc["step_time_s"]))
    assert doc["tokens_per_s"] > 0
    assert 0 < doc["comm_share"] < 1
    assert doc["timed_steps"] == 29 and doc["buckets_per_step"] >= 1
    assert isinstance(doc["comm_method"], str) and doc["comm_method"]
    # The summary line carries the same figures for a reader of the console.
    assert "tokens/s" in doc["_stdout"] and "% of step time" in doc["_stdout"]


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="matplotlib not installed")
def test_plot_written(long_run: dict[str, Any], workdir: Path) -> None:
    png = workdir / "loss.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    assert png.stat().st_size > 5_000  # axes, two curves, labels: not an empty canvas


@pytest.mark.skipif(HAVE_MATPLOTLIB, reason="matplotlib installed")
def test_plot_without_matplotlib_is_usage_error(workdir: Path) -> None:
    proc = run_cli("--plot", str(workdir / "none.png"))
    assert proc.returncode == 2
    assert "matplotlib" in first_line_of_error(proc)


def test_same_seed_same_losses(short_runs: list[dict[str, Any]]) -> None:
    a, b, _ = short_runs
    assert a["config"]["world_size"] == b["config"]["world_size"] == 2
    assert a["train_loss"] == b["train_loss"]  # bit-identical, not merely close
    assert a["val_loss"] == b["val_loss"]


def test_pycomm_matches_gloo(short_runs: list[dict[str, Any]]) -> None:
    pycomm_run, _, gloo_run = short_runs
    assert gloo_run["config"]["backend"] == "gloo"
    # Same seed, same data, same hook: only the all-reduce differs, and both
    # compute the same sums, so the losses agree up to summation order.
    assert pycomm_run["train_loss"] == pytest.approx(gloo_run["train_loss"], rel=1e-4)
    for ours, theirs in zip(pycomm_run["val_loss"], gloo_run["val_loss"]):
        assert ours["step"] == theirs["step"] and ours["loss"] == pytest.approx(theirs["loss"], rel=1e-4)


def test_torchrun_matches_spawn(short_runs: list[dict[str, Any]], workdir: Path) -> None:
    # Under torchrun the ranks join through env:// instead of the launcher's
    # store; with the same flags the run must be the same run.
    log = workdir / "torchrun.json"
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = run_cli("--json", str(log), "--backend", "pycomm", *SHORT, launcher=torchrun)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    doc = json.loads(log.read_text())
    assert doc["config"]["world_size"] == 2
    assert doc["train_loss"] == short_runs[0]["train_loss"]
    assert doc["val_loss"] == short_runs[0]["val_loss"]


def test_hook_implementation_recorded(short_runs: list[dict[str, Any]]) -> None:
    expected = "pycomm.hooks.fp16_hook" if have_pycomm_hooks() else "torch.fp16_compress_hook"
    assert short_runs[0]["config"]["hook_impl"] == expected


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--bogus"], "unrecognized arguments"),
        (["--steps", "0"], "--steps"),
        (["--hook", "int4"], "--hook"),
        (["--backend", "mpi"], "--backend"),
        (["--lr", "-1"], "--lr"),
        (["--error-feedback"], "--error-feedback"),
    ],
    ids=["unknown", "steps0", "hook", "backend", "lr", "ef-without-hook"],
)
def test_bad_flag_exits_2(args: list[str], needle: str) -> None:
    proc = run_cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert needle in first_line_of_error(proc)


@pytest.mark.skipif(have_pycomm_hooks(), reason="pycomm.hooks present: fp8 runs")
def test_fp8_without_pycomm_hooks_exits_2() -> None:
    proc = run_cli("--hook", "fp8")
    assert proc.returncode == 2
    assert first_line_of_error(proc).endswith("fp8 hook needs pycomm.hooks")


@pytest.mark.skipif(not have_pycomm_hooks(), reason="pycomm.hooks missing: fp8 is a usage error (tested above)")
def test_fp8_with_error_feedback_trains(workdir: Path) -> None:
    doc = train(workdir, "fp8", "--backend", "pycomm", "--hook", "fp8", "--error-feedback", *SHORT_BASE)
    assert doc["config"]["hook_impl"] == "pycomm.hooks.fp8_hook" and doc["config"]["error_feedback"] is True
    losses = doc["train_loss"]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]


# In-process checks of the hook choice, whatever this pycomm has: the CLI
# paths above only see the branch that the installed pycomm takes.


def test_hook_choice_without_pycomm_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    from pycomm.train import hooks

    monkeypatch.setattr(hooks, "pycomm_hooks", lambda: None)
    with pytest.raises(hooks.HookUnavailable, match="^fp8 hook needs pycomm.hooks$"):
        hooks.check_hook("fp8", error_feedback=False)
    with pytest.raises(hooks.HookUnavailable, match="--error-feedback needs pycomm.hooks"):
        hooks.check_hook("fp16", error_feedback=True)
    assert hooks.choose_hook("fp16", error_feedback=False).impl == "torch.fp16_compress_hook"
    assert hooks.choose_hook("bf16", error_feedback=False).impl == "torch.bf16_compress_hook"
    assert hooks.choose_hook("none", error_feedback=False).impl == "torch.allreduce_hook"


def test_hook_choice_prefers_pycomm_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from pycomm.train import hooks

    made: list[dict[str, Any]] = []
    fake = ModuleType("pycomm.hooks")
    fake.CompressionState = lambda **kwargs: made.append(kwargs) or SimpleNamespace(**kwargs)  # type: ignore[attr-defined]
    fake.fp16_hook = fake.bf16_hook = fake.fp8_hook = lambda state, bucket: None  # type: ignore[attr-defined]
    monkeypatch.setattr(hooks, "pycomm_hooks", lambda: fake)
    for name in ("fp16", "bf16", "fp8"):
        assert hooks.choose_hook(name, error_feedback=True).impl == f"pycomm.hooks.{name}_hook"
    assert made == [{"process_group": None, "error_feedback": True}] * 3


def test_comm_timer_counts_overlap_once() -> None:
    from pycomm.train.hooks import CommTimer

    timer = CommTimer()
    timer._intervals = [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]  # two overlapping buckets, one apart
    first = timer.take()
    assert (first.busy_s, first.buckets) == (4.0, 3)
    assert first.exposed_s == 1.0  # from the last hook call (5.0) to the last completion (6.0)
    empty = timer.take()
    assert (empty.busy_s, empty.exposed_s, empty.buckets) == (0.0, 0.0, 0)


def test_comm_timer_exposed_is_what_outlasts_the_last_call() -> None:
    from pycomm.train.hooks import CommTimer

    timer = CommTimer()
    # An early bucket's all-reduce finishes after the last bucket was handed over.
    timer._intervals = [(0.0, 4.0), (3.0, 3.5)]
    step = timer.take()
    assert step.exposed_s == 1.0 and step.busy_s == 4.0
