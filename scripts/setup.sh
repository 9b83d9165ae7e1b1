#!/usr/bin/env bash
# Installs what pycomm needs and builds it in place. Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip --version >/dev/null
# torch 2.13.0 CPU build (a CUDA machine gets torch's CUDA build the same way).
if ! python3 -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13') else 1)" 2>/dev/null; then
  python3 -m pip install -q "torch==2.13.0"
fi
python3 -m pip install -q ninja pytest hypothesis numpy matplotlib
command -v cmake >/dev/null || python3 -m pip install -q cmake
# No build isolation: an isolated build would fetch another torch. The first install registers the
# package in place; later runs rebuild only when a source changed, incrementally with ninja.
# (Re)register when the installed package is not this checkout, e.g. a copy moved elsewhere.
so=$(ls pycomm/_C*.so 2>/dev/null | head -n 1 || true)
registered=$(cd / && python3 -c "import importlib.util as u; s = u.find_spec('pycomm'); print(s.submodule_search_locations[0] if s else '')" 2>/dev/null || true)
if [ -z "$so" ] || [ -z "$registered" ] || [ "$(realpath -m "$registered")" != "$(pwd -P)/pycomm" ]; then
  python3 -m pip install -q --no-build-isolation -e .
elif [ -n "$(find csrc setup.py -newer "$so" -type f 2>/dev/null | head -n 1)" ]; then
  python3 setup.py -q build_ext --inplace
fi
