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
# largest power of two q <= p (two steps, 2n bytes), then whole-vector doubling (n log2 q bytes)
# below 64 KiB, below 512 KiB when q is 2, and halving-doubling from there; rhd's steps are
# counted 2 log2 q in both modes (cost_model.h says why).
SCHEDULES = {
    ("ring", 1, 4096): (0, 0), ("ring", 4, 4096): (6, 6144), ("ring", 5, 1000): (8, 1600),
    ("tree", 2, 4096): (2, 8192), ("tree", 5, 4096): (6, 8192), ("tree", 8, 100): (6, 200),
    ("rhd", 4, 4096): (4, 8192), ("rhd", 6, 4096): (6, 4096 * 2 + 8192), ("rhd", 8, 1 << 20): (6, 1.75 * (1 << 20)),
    ("rhd", 6, 1 << 20): (6, 1.5 * (1 << 20) + 2 * (1 << 20)), ("rhd", 1, 1 << 20): (0, 0),
    ("rhd", 4, 65535): (4, 2 * 65535), ("rhd", 4, 65536): (4, 1.5 * 65536), ("rhd", 3, 4096): (4, 4096 + 8192),
}


@pytest.mark.parametrize(("algorithm", "p", "n"), SCHEDULES)
def test_model_follows_the_schedules(algorithm: str, p: int, n: int) -> None:
    assert (tuning.steps(algorithm, p), tuning.bytes_moved(algorithm, n, p)) == pytest.approx(SCHEDULES[algorithm, p, n])


@pytest.mark.parametrize("n", [1, 4096, 61440, 65536, 256 * 1024, (1 << 19) - 4])
def test_two_ranks_take_one_exchange_below_the_halving_threshold(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # rhd is one exchange of the vector, every other schedule two: no table can make them cheaper,
    # the shipped one included (fitted at world 4, it would pick the ring at 60 KiB).
    monkeypatch.setenv("PYCOMM_TUNING_FILE", str(tuning.DEFAULT_TABLE))
    ring_cheap = [(-1, {"ring": (1e-9, 1e-15), "tree": (1e-3, 1e-6), "rhd": (1e-3, 1e-6)})]
    for bands in (tuning.load_cost_model(), ring_cheap):
        assert tuning.choose(bands, n, 2) == "rhd"
    assert tuning.choose(ring_cheap, 1 << 19, 2) == "ring"  # from the threshold on, the table decides
    assert tuning.choose(ring_cheap, n, 3) == "ring"


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


def test_the_shipped_table_is_the_models_fit_of_its_own_measurements(monkeypatch: pytest.MonkeyPatch) -> None:
    # A change to steps(p) or bytes(n, p) must refit the shipped table from its recorded points
    # (it is exact at every measured size), or auto picks by constants fitted to another model.
    monkeypatch.setenv("PYCOMM_TUNING_FILE", str(tuning.DEFAULT_TABLE))
    document = json.loads(tuning.DEFAULT_TABLE.read_text())
    world = int(document["world_size"])
    points = [(p["algo"], int(p["size_bytes"]), world, float(p["seconds"])) for p in document["points"]]
    bands = tuning.load_cost_model()
    for algorithm, n, p, t in points:
        alpha, beta = next(model for limit, model in bands if limit < 0 or n <= limit)[algorithm]
        predicted = alpha * tuning.steps(algorithm, p) + beta * tuning.bytes_moved(algorithm, n, p)
        assert predicted == pytest.approx(t, rel=1e-6), (algorithm, n)
