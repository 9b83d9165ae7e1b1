"""Recovering a training run (``python -m pycomm.train``): checkpoints, resume, fault injection,
torchrun's elastic restart, and gradient accumulation's bytes.

The reference for every resumed run is the same run uninterrupted: its per-step losses must be
equal bit for bit, not merely close. The runs are few and small (world 3, 6 steps of the small
model with batch 4) and independent ones run side by side, so the file takes about a minute on 2
cores. Every run goes over TCP (PYCOMM_TRANSPORT=tcp), so that the per-rank byte counters see
the gradient all-reduce, and uses the fp16 hook with error feedback, so that a checkpoint must
carry each rank's residuals for the losses to match. The checks of bad checkpoints and of the
pieces (atomic writes, the fault marker, the residuals' layout) run in this process. With
PYCOMM_FULL_SWEEP=1 and root, the torchrun restart also runs across two namespace hosts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cli_runs import assert_exit_0, command_env, run_python, source_root
from support import import_pycomm_or_skip

_pycomm = import_pycomm_or_skip("python -m pycomm.train")

SOURCE_ROOT = source_root(_pycomm)
TIMEOUT_S = 240  # per run; runs go two or three at a time on a loaded 2-core machine
ENV = {"PYCOMM_TRANSPORT": "tcp"}
STEPS, EVERY, FAIL_AT = 6, 3, 5  # checkpoints after steps 3 and 6; rank 1 killed in step 5
WORLD = 3  # at 3 the ring's sums depend on the bucket layout, and torchrun's restarts raced stale store keys
RUN = ["--steps", str(STEPS), "--eval-every", "3", "--batch-size", "4", "--hook", "fp16", "--error-feedback",
       "--timeout", "30"]  # fmt: skip
SPAWN = ["--nproc", str(WORLD)]  # not under torchrun, whose parser would take --nproc for its --nproc-per-node
FAULT = ["--fail-rank", "1", "--fail-at-step", str(FAIL_AT)]
TORCHRUN = [
    "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--max-restarts", "2",
    "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
]  # fmt: skip
FAULT_LINE = "fault injection: rank 1 sends itself SIGKILL in step 5"


def trainer(log: Path, ckpt: Path | None, *args: str, launcher: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    ckpt_args = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", str(EVERY)] if ckpt is not None else []
    ranks = [] if launcher else SPAWN
    argv = [*launcher, "-m", "pycomm.train", "--json", str(log), *RUN, *ranks, *ckpt_args, *args]
    return run_python(SOURCE_ROOT, argv, timeout_s=TIMEOUT_S, env=ENV)


def log_of(proc: subprocess.CompletedProcess[str], log: Path) -> dict[str, Any]:
    assert_exit_0(proc)
    document: dict[str, Any] = json.loads(log.read_text())
    document["_output"] = proc.stdout + proc.stderr
    return document


def side_by_side(*jobs: Callable[[], subprocess.CompletedProcess[str]]) -> list[subprocess.CompletedProcess[str]]:
    with ThreadPoolExecutor(len(jobs)) as pool:
        return [future.result() for future in [pool.submit(job) for job in jobs]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every run of the file: uninterrupted, killed then resumed, torchrun-restarted, accumulated."""
    tmp = tmp_path_factory.mktemp("recovery")
    uninterrupted, killed, accum, restarted = side_by_side(
        lambda: trainer(tmp / "whole.json", tmp / "whole"),
        lambda: trainer(tmp / "killed.json", tmp / "resumed", *FAULT),
        lambda: trainer(tmp / "accum.json", None, "--accum-steps", "4"),
        lambda: trainer(tmp / "restarted.json", tmp / "restarted", *FAULT, launcher=tuple(TORCHRUN)),
    )
    # The same command again (fault flags included): it resumes, and the fault does not fire twice.
    resumed = trainer(tmp / "resumed.json", tmp / "resumed", *FAULT)
    return {
        "tmp": tmp,
        "whole": log_of(uninterrupted, tmp / "whole.json"),
        "killed": killed,
        "resumed": log_of(resumed, tmp / "resumed.json"),
        "restarted": log_of(restarted, tmp / "restarted.json"),
        "accum": log_of(accum, tmp / "accum.json"),
    }


def test_checkpoints_on_disk(runs: dict[str, Any]) -> None:
    directory = runs["tmp"] / "whole"
    latest = json.loads((directory / "latest").read_text())
    assert latest["file"] == "step-000006.pt" and latest["header"]["step"] == 6
    assert latest["header"]["world_size"] == WORLD and latest["header"]["model"] == "small"
    # The newest two are kept; no temporary is left behind.
    assert sorted(os.listdir(directory)) == ["latest", "step-000003.pt", "step-000006.pt"]
    assert runs["whole"]["resumed_from_step"] is None


def test_killed_rank_fails_the_run_and_leaves_a_checkpoint(runs: dict[str, Any]) -> None:
    proc = runs["killed"]
    assert proc.returncode == 1, proc.stderr
    assert FAULT_LINE in proc.stderr and "rank 1 died (signal 9)" in proc.stderr
    directory = runs["tmp"] / "resumed"
    assert (directory / "fault-fired-rank1-step5").exists()


def test_resumed_run_reproduces_the_uninterrupted_one(runs: dict[str, Any]) -> None:
    whole, resumed = runs["whole"], runs["resumed"]
    assert resumed["resumed_from_step"] == EVERY
    assert "resuming from" in resumed["_output"] and FAULT_LINE not in resumed["_output"]
    assert len(resumed["train_loss"]) == STEPS
    # Bit for bit: the steps after the resume point, and the earlier ones carried in the checkpoint.
    assert resumed["train_loss"][EVERY:] == whole["train_loss"][EVERY:]
    assert resumed["train_loss"] == whole["train_loss"]
    assert resumed["val_loss"] == whole["val_loss"]


def test_torchrun_restarts_the_workers_and_they_resume(runs: dict[str, Any]) -> None:
    whole, restarted = runs["whole"], runs["restarted"]
    output = restarted["_output"]
    assert output.count(FAULT_LINE) == 1, output  # fired in the first incarnation only
    assert restarted["resumed_from_step"] == EVERY
    assert restarted["train_loss"] == whole["train_loss"]
    assert restarted["val_loss"] == whole["val_loss"]


def test_accumulation_all_reduces_once_per_optimizer_step(runs: dict[str, Any]) -> None:
    once, accum = runs["whole"]["wire"], runs["accum"]["wire"]
    assert runs["accum"]["config"]["accum_steps"] == 4
    # Some steps carry a few hundred bytes besides the gradients (DDP's one-off setup);
    # the most common count per step is one gradient all-reduce.
    for field in ("socket_sent", "payload_sent"):
        for rank in range(WORLD):
            k1 = max(set(once["by_rank"][field][rank]), key=once["by_rank"][field][rank].count)
            k4 = max(set(accum["by_rank"][field][rank]), key=accum["by_rank"][field][rank].count)
            assert k4 == k1, (field, rank, once["by_rank"][field][rank], accum["by_rank"][field][rank])
    # One fp16 all-reduce of the gradient: each rank sends at least (world - 1) / world of its fp16
    # size (a reduce-scatter's share), at most twice that (and the all-gather's).
    fp16 = once["gradient_bytes"] / 2
    assert (WORLD - 1) / WORLD * fp16 <= once["per_step_and_rank"]["payload_sent"] <= 2.05 * (WORLD - 1) / WORLD * fp16
    per_micro = accum["per_micro_batch_and_rank"]["payload_sent"]
    assert per_micro == pytest.approx(accum["per_step_and_rank"]["payload_sent"] / 4)


def _netns() -> tuple[Any, str | None]:
    sys.path.insert(0, str(SOURCE_ROOT / "benchmarks"))
    import netns  # the namespace-hosts testbed that test_multihost.py uses

    return netns.Testbed, netns.available()


TESTBED, NO_NETNS = _netns()


def on_two_hosts(tmp: Path) -> dict[str, Any]:
    """One rank on each of two namespace hosts, under a torchrun agent each, rank 1 killed in step 5."""
    log, ckpt = tmp / "hosts.json", tmp / "hosts"
    # Each agent counts its own restarts, so the workers' keys cannot be told apart by that
    # count across nodes: rank 0 serves a fresh store per restart instead (see launch._agent_store).
    env = {**ENV, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "PYCOMM_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
    train = ["-m", "pycomm.train", "--json", str(log), *RUN, "--checkpoint-dir", str(ckpt),
             "--checkpoint-every", str(EVERY), *FAULT]  # fmt: skip
    with TESTBED(hosts=2) as bed:
        agent = ["-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "2",
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{bed.address(0)}:29533", "--rdzv-id", "recovery"]
        procs = [
            bed.popen(host, [sys.executable, *agent, "--rdzv-conf", f"is_host={host == 0}",
                             "--local-addr", bed.address(host), *train],
                      env=command_env(SOURCE_ROOT, env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for host in range(2)
        ]  # fmt: skip
        try:
            outputs = [proc.communicate(timeout=TIMEOUT_S)[0] for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
    for host, (proc, output) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"host {host}: exit {proc.returncode}\n{output[-4000:]}"
    document: dict[str, Any] = json.loads(log.read_text())
    document["_output"] = "".join(outputs)
    return document


@pytest.mark.skipif(NO_NETNS is not None, reason=f"namespace hosts unavailable: {NO_NETNS}")
@pytest.mark.skipif(os.environ.get("PYCOMM_FULL_SWEEP") != "1", reason="another 45 s: with PYCOMM_FULL_SWEEP=1")
@pytest.mark.serial  # network namespaces and a fixed port
def test_torchrun_restart_across_two_hosts(tmp_path: Path) -> None:
    reference, hosts = side_by_side(
        lambda: trainer(tmp_path / "pair.json", None, "--nproc", "2"),
        lambda: subprocess.CompletedProcess([], 0, json.dumps(on_two_hosts(tmp_path)), ""),
    )
    whole, restarted = log_of(reference, tmp_path / "pair.json"), json.loads(hosts.stdout)
    assert restarted["config"]["world_size"] == 2 and restarted["resumed_from_step"] == EVERY
    assert restarted["_output"].count(FAULT_LINE) == 1
    assert restarted["train_loss"] == whole["train_loss"]
    assert restarted["val_loss"] == whole["val_loss"]


# Bad checkpoints: usage errors (exit 2, one line), found before any rank starts. In this
# process: pycomm.train.cli.main returns before launching anything.


@pytest.fixture()
def copied(runs: dict[str, Any], tmp_path: Path) -> Path:
    directory = tmp_path / "ckpt"
    shutil.copytree(runs["tmp"] / "whole", directory)
    return directory


def usage_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    from pycomm.train.cli import main

    assert main([*RUN, *SPAWN, *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_checkpoint_of_another_world_size(copied: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = usage_error(capsys, "--checkpoint-dir", str(copied), "--nproc", "2")
    assert "is from another run: world size 3, this run has 2" in line


def test_checkpoint_of_another_model(copied: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = usage_error(capsys, "--checkpoint-dir", str(copied), "--model", "large", "--batch-size", "4")
    assert "--model small, this run has large" in line


def test_checkpoint_of_another_pycomm(copied: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    written_by = _pycomm.__version__
    monkeypatch.setattr(_pycomm, "__version__", "99.0")  # this pycomm is newer than the checkpoint's
    line = usage_error(capsys, "--checkpoint-dir", str(copied))
    assert f"pycomm {written_by}, this is pycomm 99.0" in line


def test_truncated_checkpoint(copied: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = copied / "step-000006.pt"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert "step-000006.pt is truncated or corrupt" in usage_error(capsys, "--checkpoint-dir", str(copied))


def test_corrupt_latest(copied: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (copied / "latest").write_text('{"file": "step-000006.pt", "sha2')
    assert "latest is corrupt" in usage_error(capsys, "--checkpoint-dir", str(copied))


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--resume", "--checkpoint-dir", "{empty}"], "--resume: no checkpoint in"),
        (["--resume"], "--resume needs --checkpoint-dir"),
        (["--checkpoint-every", "5"], "--checkpoint-every needs --checkpoint-dir"),
        (["--fail-rank", "1"], "--fail-rank and --fail-at-step go together"),
        (["--fail-rank", "3", "--fail-at-step", "3"], "--fail-rank 3 is not a rank of world size 3"),
        (["--fail-rank", "0", "--fail-at-step", "7"], "--fail-at-step 7 is past --steps 6"),
    ],
    ids=["resume-empty", "resume-no-dir", "every-no-dir", "fail-rank-alone", "fail-rank-big", "fail-step-big"],
)
def test_bad_recovery_flags(args: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    filled = [a.replace("{empty}", str(tmp_path)) for a in args]
    assert needle in usage_error(capsys, *filled)


def test_bad_checkpoint_from_the_command_line(copied: Path) -> None:
    # The same check as a user meets it: exit 2, one line, no rank started.
    proc = run_python(SOURCE_ROOT, ["-m", "pycomm.train", *RUN, *SPAWN, "--checkpoint-dir", str(copied), "--nproc", "2"],
                      timeout_s=TIMEOUT_S)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "world size 3, this run has 2" in proc.stderr


# The pieces, in this process.


def test_a_failed_write_leaves_latest_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from pycomm.train import checkpoint
    from pycomm.train.config import TrainConfig

    config = TrainConfig.for_model("small", steps=10)
    checkpoint.save(str(tmp_path), checkpoint.Header.of_run(config, 2, 4), {"x": torch.arange(3)})
    (tmp_path / ".tmp-crashed").write_bytes(b"half a checkpoint")  # a write that a SIGKILL cut short

    real_replace = os.replace

    def crash_on_checkpoint(src: str, dst: str) -> None:
        if dst.endswith(".pt"):
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", crash_on_checkpoint)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(str(tmp_path), checkpoint.Header.of_run(config, 2, 8), {"x": torch.arange(5)})
    assert sorted(os.listdir(tmp_path)) == ["latest", "step-000004.pt"]  # the stale temporary is gone too
    latest = checkpoint.resume_point(str(tmp_path), config, 2, required=True)
    assert latest is not None and latest.header.step == 4
    assert checkpoint.load(latest)["x"].tolist() == [0, 1, 2]


def test_fault_fires_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    from pycomm.train import faults
    from pycomm.train.config import TrainConfig

    sent: list[int] = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: sent.append(sig))
    config = TrainConfig(fail_rank=1, fail_at_step=3, checkpoint_dir=str(tmp_path))
    for rank, step in ((0, 3), (1, 2), (1, 3), (1, 3)):
        plan = faults.FaultPlan.of(config)  # a new plan each time: a new incarnation of the run
        assert plan is not None
        plan.maybe_fire(rank, step)
    assert sent == [signal.SIGKILL]
    # Without a checkpoint directory, a torchrun restart is what says it fired already.
    plan = faults.FaultPlan.of(TrainConfig(fail_rank=0, fail_at_step=1, fail_signal="STOP"))
    assert plan is not None and plan.marker is None
    monkeypatch.setenv(faults.RESTART_COUNT_ENV, "1")
    plan.maybe_fire(0, 1)
    monkeypatch.setenv(faults.RESTART_COUNT_ENV, "0")
    plan.maybe_fire(0, 1)
    assert sent == [signal.SIGKILL, signal.SIGSTOP]


def test_residuals_follow_their_parameters() -> None:
    import torch

    from pycomm.train.residuals import ResidualLayout

    params = [torch.nn.Parameter(torch.zeros(n)) for n in (2, 3)]

    def bucket(order: list[int]) -> SimpleNamespace:
        size = sum(params[i].numel() for i in order)
        buffer = torch.zeros(size)
        return SimpleNamespace(parameters=lambda: [params[i] for i in order], buffer=lambda: buffer, index=lambda: 0)

    state = SimpleNamespace(residuals={})
    layout = ResidualLayout(params)
    seen: list[list[float]] = []
    hook = layout.wrap(lambda s, b: seen.append(s.residuals[0].tolist()) if 0 in s.residuals else None)
    hook(state, bucket([0, 1]))
    state.residuals[0] = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])  # what the hook left: p0 = 1,2; p1 = 3,4,5
    hook(state, bucket([1, 0]))  # DDP re-laid the bucket: p1 first
    assert seen == [[3.0, 4.0, 5.0, 1.0, 2.0]]
    pieces = layout.by_parameter(state.residuals)
    assert {i: t.tolist() for i, t in pieces.items()} == {0: [1.0, 2.0], 1: [3.0, 4.0, 5.0]}
    # A resumed run: another layout again, the slices put back where their parameters are.
    fresh, resumed = ResidualLayout(params), SimpleNamespace(residuals={})
    fresh.restore(pieces)
    fresh.wrap(lambda s, b: None)(resumed, bucket([0, 1]))
    assert resumed.residuals[0].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_each_torchrun_restart_gets_store_keys_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # torchrun's c10d rendezvous keeps one store across restarts; what a killed worker wrote
    # there (its listening address) must not be what its successor reads.
    import datetime

    import torch.distributed as dist

    from pycomm.train import launch

    timeout = datetime.timedelta(seconds=10)
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    first = launch._agent_store(timeout)
    assert first is not None
    first.set("address/0", "dead:1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    second = launch._agent_store(timeout)
    assert second is not None and not second.check(["address/0"])
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")  # rank 0 serves a new store each time
    assert launch._agent_store(timeout) is None
