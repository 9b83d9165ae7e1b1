"""Every collective x reduce op x dtype x size x world size, against reference.py.

One spawn per (backend, world size, collective family); the sweep itself runs
inside the ranks (see sweeps.py) and returns the failed checks.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from mp import run_ranks
from support import FULL_SWEEP, assert_no_failures
from sweeps import SWEEPS, collective_worker

# Generous: 4 ranks on 2 cores, ~1000 collectives per family.
TIMEOUT_S = 600 if FULL_SWEEP else 180


@pytest.mark.parametrize("family", sorted(SWEEPS))
def test_collective_family(backend: str, world_size: int, family: str) -> None:
    results = run_ranks(
        collective_worker,
        world_size,
        backend=backend,
        timeout_s=TIMEOUT_S,
        args=(family, backend),
    )
    assert_no_failures(results)


# pycomm only: the same sweeps with non-default pycomm.Options. Each network
# all-reduce schedule is forced in turn (transport="tcp", or the same-host
# shared-memory path would be taken instead); 3 ranks is not a power of two,
# which matters to recursive halving-doubling. chunk_bytes=4096 (the minimum)
# cuts the 4099-element and 3-MiB cases into many chunks that do not align with
# every dtype's per-rank slice.
def _forced(algorithm: str, world: int, family: str = "all_reduce") -> Any:
    options = {"algorithm": algorithm, "transport": "tcp", "chunk_bytes": 4096}
    return pytest.param(
        options, world, family, id=f"{algorithm}-tcp-chunk4096-w{world}-{family}"
    )


_OPTION_CASES = [
    *(
        _forced(algorithm, world)
        for algorithm in ("ring", "tree", "rhd")
        for world in (3, 4)
    ),
    pytest.param(
        {"transport": "auto", "debug": "INFO"}, 2, "misc", id="auto-info-w2-misc"
    ),
]


@pytest.mark.parametrize(("options", "world", "family"), _OPTION_CASES)
def test_collectives_with_options(
    pycomm: ModuleType, options: dict[str, Any], world: int, family: str
) -> None:
    results = run_ranks(
        collective_worker,
        world,
        backend="pycomm",
        timeout_s=TIMEOUT_S,
        pg_options=pycomm.Options(**options),
        args=(family, "pycomm", False),
    )
    assert_no_failures(results)
