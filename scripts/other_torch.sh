#!/usr/bin/env bash
# The pytest suite against another torch (PYCOMM_TORCH=<version> ./scripts/test.sh [pytest args]
# runs this): torch==<version> goes into its own virtual environment, build/venv-torch<version>
# (without --system-site-packages, so the system's torch stays out of it), and pycomm is built
# there from a copy of this tree, build/venv-torch<version>/tree. The copy keeps this checkout's
# in-place extension (pycomm/_C*.so, built against the system's torch) and build/ untouched, and
# scripts/setup.sh then runs in it unchanged. The native tests are not run again: the core has no
# torch. Without a visible GPU the extension is built CPU-only (PYCOMM_NO_CUDA=1, unless set):
# the CUDA sources include no torch header and the default test command compile-checks them.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$1
shift
venv=build/venv-torch$version
tree=$venv/tree

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
installed=$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('torch'))" 2>/dev/null || true)
if [ "${installed%%+*}" != "$version" ]; then
  echo "[torch $version] installing torch==$version into $venv"
  "$venv/bin/python" -m pip install -q "torch==$version"
fi

# A fresh copy of the sources (files deleted here go there too) with their times kept, so that
# setup.sh and ninja rebuild only what changed; the copy's own extension and build/ are kept.
mkdir -p "$tree" "$venv/kept"
mv "$tree"/pycomm/_C*.so "$venv/kept/" 2>/dev/null || true
find "$tree" -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +
tar -cf - --exclude=./build --exclude=./.git --exclude='*.so' --exclude='*.egg-info' \
  --exclude=__pycache__ --exclude=.pytest_cache . | tar -xf - -C "$tree"
mv "$venv"/kept/_C*.so "$tree/pycomm/" 2>/dev/null || true

if [ -z "${PYCOMM_NO_CUDA:-}" ] && ! nvidia-smi -L >/dev/null 2>&1; then
  echo "[torch $version] no GPU visible: building the CPU-only extension (PYCOMM_NO_CUDA=1)"
  export PYCOMM_NO_CUDA=1
fi
cd "$tree"
export PATH=$PWD/../bin:$PATH VIRTUAL_ENV=$PWD/..
./scripts/setup.sh
echo "[phase] torch $version: setup and build: ${SECONDS} s"
python3 -c "import torch, pycomm; print(f'[torch {torch.__version__}] pycomm from {pycomm.__file__}')"
rc=0
python3 -m pytest tests -q -p no:cacheprovider --durations=15 "$@" || rc=$?
echo "[phase] torch $version: pytest: ${SECONDS} s since the start"
# Exit code 5 means pytest collected no test: not a failure of the suite.
if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit 1; fi
