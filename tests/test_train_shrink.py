"""``python -m pycomm.train --on-failure shrink``: a rank SIGKILLed (TCP) or SIGSTOPped (shared
memory) in step 10 of 30; the survivors shrink the group, agree on the state, rebuild DDP and
finish at world 2 with no restart; the run exits 0 and says which rank it went on without. Usage
errors for the combinations it does not support.

Figures are printed with the ``[reliability]`` prefix (run with ``-s``); see docs/RELIABILITY.md.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import ModuleType

import pytest
from cli_runs import run_python, source_root, train_to_json
from cluster import report

WORLD, STEPS, FAIL_AT = 3, 30, 10
BASE = ["--backend", "pycomm", "--nproc", str(WORLD), "--steps", str(STEPS), "--batch-size", "4"]


@pytest.mark.parametrize("sig,transport", [("KILL", "tcp"), ("STOP", "auto")])
def test_run_goes_on_without_a_lost_rank(pycomm: ModuleType, tmp_path: Path, sig: str, transport: str) -> None:
    root = source_root(pycomm)
    # A frozen rank is found by the timeout: a short one keeps the test short.
    timeout = ["--timeout", "3"] if sig == "STOP" else []
    log = train_to_json(
        root,
        tmp_path / "shrunk.json",
        [*BASE, *timeout, "--on-failure", "shrink", "--fail-rank", "1", "--fail-at-step", str(FAIL_AT),
         "--fail-signal", sig],
        timeout_s=240,
        env={"PYCOMM_TRANSPORT": transport},
    )
    out = log["_stdout"]
    assert log["config"]["world_size"] == WORLD - 1, log["config"]["world_size"]
    assert log["lost_ranks"] == [1], log["lost_ranks"]
    assert f"step {FAIL_AT}: lost rank(s) [1] of {WORLD}" in out, out
    losses = log["train_loss"]
    assert len(losses) == STEPS and all(math.isfinite(x) and x > 0 for x in losses), losses
    # It trained on after the shrink: the loss kept falling from the untrained ln 256.
    assert losses[-1] < losses[0] - 1.0, (losses[0], losses[-1])
    shrink_s = float(re.search(r"shrunk to \d+ ranks in ([0-9.]+) s", out).group(1))  # type: ignore[union-attr]
    first_s = float(re.search(r"first step on the shrunk group done ([0-9.]+) s", out).group(1))  # type: ignore[union-attr]
    report(
        f"--on-failure shrink (world {WORLD}, SIG{sig} of rank 1 in step {FAIL_AT} of {STEPS}, transport {transport}): "
        f"shrink {shrink_s:.3f} s, first step on the shrunk group {first_s:.3f} s after the failure was caught; "
        f"final train loss {losses[-1]:.4f}, val {log['val_loss'][-1]['loss']:.4f}"
    )
    assert first_s < 2.0, f"the first step on the shrunk group came {first_s:.2f} s after the failure was caught"


@pytest.mark.parametrize(
    "extra,expected",
    [
        (["--backend", "gloo"], "needs --backend pycomm"),
        (["--checkpoint-dir", "CKPT"], "two recoveries"),
    ],
)
def test_on_failure_shrink_refuses_what_it_cannot_do(pycomm: ModuleType, tmp_path: Path, extra: list[str],
                                                     expected: str) -> None:
    extra = [str(tmp_path / "ckpt") if a == "CKPT" else a for a in extra]
    proc = run_python(source_root(pycomm), ["-m", "pycomm.train", *BASE, "--on-failure", "shrink", *extra],
                      timeout_s=60)
    assert proc.returncode == 2 and expected in proc.stderr, (proc.returncode, proc.stderr)
