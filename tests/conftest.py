"""Shared fixtures: the backend parametrization and the pycomm import policy.

Tests take a ``backend`` parameter. By default it is only "pycomm", the backend
under test (DDP/FSDP tests still compare against gloo runs internally).
PYCOMM_TEST_BACKENDS=gloo,pycomm adds gloo as a reference backend, which
validates the tests themselves (known gloo gaps are skipped case by case, see
support.py); it roughly doubles the run time. Test ids carry the backend name,
so ``-k gloo`` / ``-k pycomm`` select one of them.

If ``import pycomm`` fails, pycomm tests are errors, unless PYCOMM_ALLOW_SKIP=1
(e.g. while the extension is not built yet), in which case they are skipped.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest
from support import FULL_SWEEP

BACKENDS = tuple(
    b.strip()
    for b in os.environ.get("PYCOMM_TEST_BACKENDS", "pycomm").split(",")
    if b.strip()
)
WORLD_SIZES = (1, 2, 3, 4, 5) if FULL_SWEEP else (1, 2, 3, 4)

_pycomm_import_error: BaseException | None = None
_pycomm_module: ModuleType | None = None


def load_pycomm() -> ModuleType:
    """Import pycomm, or skip/raise according to PYCOMM_ALLOW_SKIP."""
    global _pycomm_import_error, _pycomm_module
    if _pycomm_module is None and _pycomm_import_error is None:
        try:
            _pycomm_module = importlib.import_module("pycomm")
        except Exception as exc:  # noqa: BLE001  (ImportError, or a broken extension)
            _pycomm_import_error = exc
    if _pycomm_module is not None:
        return _pycomm_module
    if os.environ.get("PYCOMM_ALLOW_SKIP") == "1":
        pytest.skip(
            f"import pycomm failed ({_pycomm_import_error!r}) and PYCOMM_ALLOW_SKIP=1"
        )
    raise RuntimeError(
        "import pycomm failed; build it (pip install --no-build-isolation -e .) "
        "or set PYCOMM_ALLOW_SKIP=1 to skip the pycomm tests"
    ) from _pycomm_import_error


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "pycomm":
        load_pycomm()
    return name


@pytest.fixture
def pycomm() -> ModuleType:
    return load_pycomm()


@pytest.fixture(params=WORLD_SIZES, ids=lambda w: f"w{w}")
def world_size(request: pytest.FixtureRequest) -> int:
    return int(request.param)


# Files whose tests check results only (against references or each other): no time bound but hang
# guards far above what a loaded machine takes, no share of a CPU, no machine-wide state (/dev/shm
# listings, network namespaces, a rank's fds or threads seen from outside). scripts/test.sh runs
# these two files at a time (pytest -n 2 --dist loadfile, -m "not serial"), and every other test
# alone (-m serial), so a new file is timed alone until it is listed here. A test of a listed file
# that needs to be alone carries @pytest.mark.serial itself.
PARALLEL_SAFE = frozenset({
    "test_algorithms", "test_bench_cli", "test_callbacks", "test_codec_exactness",
    "test_collectives", "test_compression", "test_concurrent_groups", "test_ddp_fsdp", "test_device_mesh",
    "test_functional_collectives", "test_fuzz_parsers", "test_group_lineage", "test_multiversion", "test_p2p",
    "test_profiler", "test_soak", "test_sparse", "test_split", "test_work_paths", "test_tensor_modes", "test_train_cli",
    "test_train_recovery", "test_train_report", "test_tuning",
})  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "serial: runs alone (a time bound, a CPU share or machine-wide state)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.stem not in PARALLEL_SAFE:
            item.add_marker(pytest.mark.serial)
    # The soak (about 80 s) first, so that it does not run alone at the end of a parallel run.
    items.sort(key=lambda item: item.path.stem != "test_soak")
