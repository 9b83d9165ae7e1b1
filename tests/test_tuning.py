"""The cost model behind algorithm="auto": fitted bands reproduce the measured choice at every
measured size, and a process group follows the table it is given."""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.distributed as dist
from mp import run_ranks
from test_algorithms import _ALLREDUCE_LOG, core_log_to

from pycomm import tuning

SIZES = [4096 * 4**k for k in range(8)]  # 4 KiB .. 64 MiB, as `--tune --factor 4` measures


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("world", [3, 4, 8])
def test_bands_pick_the_measured_best_at_every_measured_size(seed: int, world: int) -> None:
    rng = random.Random(seed)
    points = []
    for algorithm in tuning.ALGORITHMS:
        t = rng.uniform(50e-6, 500e-6)
        for n in SIZES:
            t += rng.uniform(0.2, 3.0) * n * 1e-9  # times grow with size, at varying rates
            points.append((algorithm, n, world, t))
    bands = tuning.fit_bands(points)
    assert [limit for limit, _ in bands] == SIZES[1:-1] + [-1]
    for n in SIZES:
        best = min(tuning.ALGORITHMS, key=lambda a: next(t for b, m, _, t in points if b == a and m == n))
        assert tuning.choose(bands, n, world) == best, (n, best)


# (algorithm, p, n) -> (steps, bytes per rank), worked out from each schedule by hand: ring's
# reduce-scatter + all-gather, the tree's up and down passes of each half, rhd's fold onto the
# largest power of two q <= p, with whole-vector doubling below 64 KiB and halving above.
SCHEDULES = {
    ("ring", 1, 4096): (0, 0), ("ring", 4, 4096): (6, 6144), ("ring", 5, 1000): (8, 1600),
    ("tree", 2, 4096): (2, 8192), ("tree", 5, 4096): (6, 8192), ("tree", 8, 100): (6, 200),
    ("rhd", 4, 4096): (4, 8192), ("rhd", 6, 4096): (6, 4096 * 2 + 8192), ("rhd", 8, 1 << 20): (6, 1.75 * (1 << 20)),
    ("rhd", 6, 1 << 20): (6, 1.5 * (1 << 20) + 2 * (1 << 20)), ("rhd", 1, 1 << 20): (0, 0),
}


@pytest.mark.parametrize(("algorithm", "p", "n"), SCHEDULES)
def test_model_follows_the_schedules(algorithm: str, p: int, n: int) -> None:
    assert (tuning.steps(algorithm, p), tuning.bytes_moved(algorithm, n, p)) == pytest.approx(SCHEDULES[algorithm, p, n])


def test_choice_is_the_cores() -> None:
    cheap_tree = [(-1, {"ring": (1e-3, 1e-6), "tree": (1e-6, 1e-12), "rhd": (1e-3, 1e-6)})]
    assert tuning.choose(cheap_tree, 4096, 4) == "tree"
    assert tuning.choose([(-1, {"rhd": (1e-3, 1e-6)})], 4096, 4) == "rhd"  # algorithms without constants never win
    assert tuning.choose([(1024, {"ring": (1.0, 0.0)}), (-1, {"tree": (1.0, 0.0)})], 1025, 4) == "tree"
    with pytest.raises(ValueError, match="auto"):
        tuning.steps("auto", 4)
    with pytest.raises(ValueError):
        tuning.bytes_moved("ring2", 1, 4)


def test_table_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    points = [(a, n, 4, (i + 1) * 1e-4 + n * 1e-9) for i, a in enumerate(tuning.ALGORITHMS) for n in SIZES[:3]]
    bands = tuning.fit_bands(points)
    path = tmp_path / "table.json"
    tuning.write_table(path, bands, tuning.fit(points), {"world_size": 4})
    monkeypatch.setenv("PYCOMM_TUNING_FILE", str(path))
    assert tuning.load_cost_model() == bands
    path.write_text(json.dumps({"algorithms": {"ring": {"alpha": 1e-5, "beta": 1e-9}}}))
    assert tuning.load_cost_model() == [(-1, {"ring": (1e-5, 1e-9)})]  # a table of one global fit
    for broken in ({"bands": [{"up_to_bytes": 10}]}, {"bands": []}, {"bands": [{"up_to_bytes": 1, "algorithms": []}]},
                   {"bands": [{"up_to_bytes": 1, "algorithms": {}}]}, [], {"bands": [{"up_to_bytes": 1e30,
                   "algorithms": {"ring": {"alpha": 1, "beta": 1}}}]}, {"algorithms": {"ring": {"alpha": 1}}},
                   {"bands": [{"up_to_bytes": 5, "algorithms": {"ring": {"alpha": 1, "beta": 1}}}] * 2}):
        path.write_text(json.dumps(broken))
        with pytest.raises(ValueError, match="tuning table"):
            tuning.load_cost_model()


# rhd up to 16 KiB, tree up to 1 MiB, ring above: each band makes one algorithm far cheaper.
CHEAP, DEAR = (1e-6, 1e-12), (1e-3, 1e-6)
BANDS = [(16 * 1024, "rhd"), (1 << 20, "tree"), (-1, "ring")]


def _auto_worker(rank: int, world: int, table: str) -> list[tuple[int, str]]:
    import pycomm

    os.environ["PYCOMM_TUNING_FILE"] = table
    group = dist.new_group(backend="pycomm", pg_options=pycomm.Options(transport="tcp", debug="INFO"))
    log = os.path.join(tempfile.gettempdir(), f"pycomm-auto-{os.getpid()}.log")
    with core_log_to(log):
        for n in (1024, 4096, 65536, 1 << 20, 4 << 20):  # bytes
            t = torch.full((n // 4,), float(rank + 1))
            dist.all_reduce(t, group=group)
            assert bool((t == world * (world + 1) / 2).all())
    lines = Path(log).read_text().splitlines()
    os.remove(log)
    return [(int(m.group(1)), m.group(2)) for line in lines if (m := _ALLREDUCE_LOG.search(line))]


@pytest.mark.usefixtures("pycomm")
def test_group_follows_its_table(tmp_path: Path) -> None:
    table = tmp_path / "table.json"
    document = {"bands": [{"up_to_bytes": limit, "algorithms": {a: dict(zip(("alpha", "beta"), CHEAP if a == cheap else DEAR))
                                                                  for a in tuning.ALGORITHMS}}
                          for limit, cheap in BANDS]}
    table.write_text(json.dumps(document))
    for ran in run_ranks(_auto_worker, 3, backend="pycomm", timeout_s=120, args=(str(table),)):
        assert ran == [(1024, "rhd"), (4096, "rhd"), (65536, "tree"), (1 << 20, "tree"), (4 << 20, "ring")], ran
