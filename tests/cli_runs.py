"""Running pycomm's command lines (``python -m pycomm.train``, ``python -m pycomm.bench``, the
scripts in benchmarks/) in a subprocess, as a user would: the part of the test harness that
test_train_cli.py, test_train_report.py and test_bench_cli.py share.

Every run has a timeout (a hung collective must fail the test, not the CI run) and starts from
the source tree pytest imported pycomm from, whatever the cwd, with that tree first on
PYTHONPATH. The launcher variables are dropped from the environment so that the command spawns
(or, under an explicit torchrun, launches) its own ranks even when pytest itself runs as a rank.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR")
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def plot_args(path: Path) -> list[str]:
    """``--plot path`` where matplotlib is installed (the commands refuse --plot without it)."""
    return ["--plot", str(path)] if HAVE_MATPLOTLIB else []


def source_root(pycomm: ModuleType) -> Path:
    """The tree that holds the imported pycomm package."""
    return Path(os.path.abspath(str(pycomm.__file__))).parents[1]


def command_env(root: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ with ``root`` first on PYTHONPATH, without launcher variables, plus ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    for name in LAUNCHER_VARIABLES:
        env.pop(name, None)
    env.update(extra or {})
    return env


def run_python(
    root: Path, argv: Sequence[str], *, timeout_s: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python argv...`` in ``root``, output captured, stdin closed."""
    return subprocess.run(
        [sys.executable, *argv],
        check=False,
        cwd=root,
        env=command_env(root, env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


def assert_exit_0(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


def train_to_json(
    root: Path, log: Path, args: Sequence[str], *, timeout_s: float, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run the trainer to completion with ``--json log`` and return that log, its stdout under
    ``_stdout``."""
    proc = run_python(root, ["-m", "pycomm.train", "--json", str(log), *args], timeout_s=timeout_s, env=env)
    assert_exit_0(proc)
    document: dict[str, Any] = json.loads(log.read_text())
    document["_stdout"] = proc.stdout
    return document
