"""The alpha-beta cost model behind ``algorithm="auto"``: loading the table and fitting it.

For an all-reduce of n bytes over p ranks each algorithm is modelled as
``alpha * steps(p) + beta * bytes(n, p)`` (seconds), with steps and bytes per rank from its
schedule (the same formulas as csrc/core/algorithms/cost_model.cc). ``python -m pycomm.bench --tune``
measures every algorithm on this machine and fits alpha and beta by least squares; the backend
reads the table from PYCOMM_TUNING_FILE, else the user cache, else the table shipped here.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

ALGORITHMS = ("ring", "tree", "rhd")
RHD_HALVING_THRESHOLD = 64 * 1024
DEFAULT_TABLE = Path(__file__).with_name("tuning_data") / "default.json"
USER_TABLE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pycomm" / "tuning.json"


def _pow2_floor(p: int) -> int:
    q = 1
    while q * 2 <= p:
        q *= 2
    return q


def steps(algorithm: str, p: int) -> float:
    if p <= 1:
        return 0.0
    q = _pow2_floor(p)
    fold = 0 if q == p else 2
    if algorithm == "ring":
        return 2.0 * (p - 1)
    if algorithm == "tree":
        return 2.0 * math.ceil(math.log2(p))
    return 2.0 * math.log2(q) + fold


def bytes_moved(algorithm: str, n: float, p: int) -> float:
    if p <= 1:
        return 0.0
    q = _pow2_floor(p)
    fold = 0.0 if q == p else 2.0 * n
    if algorithm == "ring":
        return 2.0 * (p - 1) / p * n
    if algorithm == "tree":
        return 2.0 * n
    if n < RHD_HALVING_THRESHOLD:
        return n * math.log2(q) + fold
    return 2.0 * (q - 1) / q * n + fold


def fit(points: list[tuple[str, int, int, float]]) -> dict[str, tuple[float, float]]:
    """Least squares alpha, beta per algorithm from (algorithm, nbytes, world, seconds) points.

    Weighted by 1/seconds so small messages (latency) count as much as large ones (bandwidth).
    """
    model: dict[str, tuple[float, float]] = {}
    for algorithm in ALGORITHMS:
        rows = [(steps(a, p), bytes_moved(a, n, p), t) for a, n, p, t in points if a == algorithm and t > 0]
        if not rows:
            continue
        # Normal equations of min sum ((alpha*s + beta*b - t) / t)^2.
        sss = sum((s / t) ** 2 for s, b, t in rows)
        sbb = sum((b / t) ** 2 for s, b, t in rows)
        ssb = sum((s / t) * (b / t) for s, b, t in rows)
        sst = sum(s / t for s, b, t in rows)
        sbt = sum(b / t for s, b, t in rows)
        det = sss * sbb - ssb * ssb
        if abs(det) < 1e-30:
            continue
        alpha = (sst * sbb - sbt * ssb) / det
        beta = (sss * sbt - ssb * sst) / det
        model[algorithm] = (max(alpha, 0.0), max(beta, 0.0))
    return model


def table_path() -> Path:
    explicit = os.environ.get("PYCOMM_TUNING_FILE")
    if explicit:
        return Path(explicit)
    return USER_TABLE if USER_TABLE.exists() else DEFAULT_TABLE


def load_cost_model() -> dict[str, tuple[float, float]]:
    path = table_path()
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"pycomm: cannot read the tuning table {path}: {error}") from None
    model = {}
    for name, entry in data.get("algorithms", {}).items():
        if name in ALGORITHMS:
            model[name] = (float(entry["alpha"]), float(entry["beta"]))
    return model


def write_table(path: Path, model: dict[str, tuple[float, float]], meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = dict(meta)
    document["model"] = "seconds = alpha * steps(p) + beta * bytes_per_rank(n, p)"
    document["algorithms"] = {name: {"alpha": a, "beta": b} for name, (a, b) in model.items()}
    path.write_text(json.dumps(document, indent=2) + "\n")
