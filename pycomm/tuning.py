"""The alpha-beta cost model behind ``algorithm="auto"``: loading the table and fitting it.

For an all-reduce of n bytes over p ranks each algorithm is modelled as
``alpha * steps(p) + beta * bytes(n, p)`` (seconds), with steps and bytes per rank from its
schedule. The model itself (steps, bytes, the choice) is the core's, csrc/core/algorithms/cost_model.cc,
reached through pycomm._C; this module loads the table and fits it. ``python -m pycomm.bench --tune``
measures every algorithm on this machine at a ladder of sizes. One (alpha, beta) pair per algorithm
over the whole range mispredicts the crossovers (caches, socket buffers and chunking bend the curves),
so the table holds one pair per algorithm per band between two measured sizes, through both
measurements: exact at the measured sizes, linear in between, and still scaled to other world sizes
by steps(p) and bytes(n, p). The backend reads the table from PYCOMM_TUNING_FILE, else the user
cache, else the table shipped here.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from pycomm import _C

ALGORITHMS = ("ring", "tree", "rhd")
Model = dict[str, tuple[float, float]]  # algorithm -> (alpha seconds/step, beta seconds/byte)
Band = tuple[int, Model]  # (largest size in bytes the band covers, -1 for no limit; its constants)
DEFAULT_TABLE = Path(__file__).with_name("tuning_data") / "default.json"
USER_TABLE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pycomm" / "tuning.json"


def steps(algorithm: str, p: int) -> float:
    """steps(p) of the model, from the core (csrc/core/algorithms/cost_model.cc)."""
    return _C.model_steps(algorithm, p)


def bytes_moved(algorithm: str, n: float, p: int) -> float:
    """Bytes a rank moves in an n-byte all-reduce over p ranks, from the core."""
    return _C.model_bytes(algorithm, n, p)


def fit(points: list[tuple[str, int, int, float]]) -> Model:
    """Least squares alpha, beta per algorithm from (algorithm, nbytes, world, seconds) points.

    Weighted by 1/seconds so small messages (latency) count as much as large ones (bandwidth).
    """
    model: Model = {}
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


def _through(low: tuple[float, float, float], high: tuple[float, float, float]) -> tuple[float, float]:
    """alpha, beta of the line through two (steps, bytes, seconds) measurements of one algorithm.

    alpha may come out negative (the time grew faster than in proportion between the two sizes):
    the line is only an interpolation inside its band. A time that fell with size (noise) gives
    beta 0, and alpha their mean."""
    (s, b0, t0), (_, b1, t1) = low, high
    beta = max((t1 - t0) / (b1 - b0), 0.0) if b1 != b0 else 0.0
    alpha = ((t0 - beta * b0) + (t1 - beta * b1)) / (2 * s) if s > 0 else 0.0
    return alpha, beta


def fit_bands(points: list[tuple[str, int, int, float]]) -> list[Band]:
    """One band per pair of consecutive measured sizes, from (algorithm, nbytes, world, seconds)
    points of one world size. The first band also covers smaller sizes, the last larger ones."""
    sizes = sorted({n for _, n, _, _ in points})
    if len(sizes) < 2:
        return [(-1, fit(points))]
    measured = {(a, n): (steps(a, p), bytes_moved(a, n, p), t) for a, n, p, t in points if t > 0}
    bands: list[Band] = []
    for i, (low, high) in enumerate(zip(sizes, sizes[1:])):
        model = {
            algorithm: _through(measured[algorithm, low], measured[algorithm, high])
            for algorithm in ALGORITHMS
            if (algorithm, low) in measured and (algorithm, high) in measured
        }
        bands.append((high if i < len(sizes) - 2 else -1, model))
    return bands


def choose(bands: list[Band], nbytes: int, p: int) -> str:
    """The algorithm auto picks for an n-byte all-reduce over p ranks: the core's own choice."""
    return _C.choose_allreduce(bands, nbytes, p)


def table_path() -> Path:
    explicit = os.environ.get("PYCOMM_TUNING_FILE")
    if explicit:
        return Path(explicit)
    return USER_TABLE if USER_TABLE.exists() else DEFAULT_TABLE


def _model(entries: dict[str, Any]) -> Model:
    model = {name: (float(e["alpha"]), float(e["beta"])) for name, e in entries.items() if name in ALGORITHMS}
    if not model:
        raise ValueError(f"no algorithm among {', '.join(ALGORITHMS)}")
    return model


def _limit(value: Any) -> int:
    limit = int(value)
    if limit != -1 and not 0 <= limit < 2**63:
        raise ValueError(f"up_to_bytes {value!r} is neither -1 nor a byte count")
    return limit


def load_cost_model() -> list[Band]:
    """The bands of the table in force, smallest first (a table of one global fit is one band)."""
    path = table_path()
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        if "bands" in data:
            bands = [(_limit(b["up_to_bytes"]), _model(b["algorithms"])) for b in data["bands"]]
        else:
            bands = [(-1, _model(data["algorithms"]))]
        if not bands:
            raise ValueError("no bands")
        if len({limit for limit, _ in bands}) != len(bands):
            raise ValueError("two bands with the same up_to_bytes")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"pycomm: cannot read the tuning table {path}: {error}") from None
    return sorted(bands, key=lambda band: band[0] if band[0] >= 0 else math.inf)


def write_table(path: Path, bands: list[Band], overall: Model, meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = dict(meta)
    document["model"] = ("seconds = alpha * steps(p) + beta * bytes_per_rank(n, p), with alpha and beta "
                         "per algorithm per band of sizes (up_to_bytes -1: no limit)")
    document["bands"] = [
        {"up_to_bytes": limit, "algorithms": {name: {"alpha": a, "beta": b} for name, (a, b) in model.items()}}
        for limit, model in bands
    ]
    document["algorithms"] = {name: {"alpha": a, "beta": b} for name, (a, b) in overall.items()}
    path.write_text(json.dumps(document, indent=2) + "\n")
