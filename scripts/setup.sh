#!/usr/bin/env bash
# Installs what pycomm needs and builds it in place. Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip --version >/dev/null
# pycomm supports torch 2.13 and 2.14 (README: "Supported torch versions"). One already installed is
# kept; with none, torch 2.13.0 is installed (the CPU build here; a CUDA machine gets torch's CUDA
# build the same way); any other version stops the setup rather than being replaced.
torch_version=$(python3 -c "import importlib.metadata as m; print(m.version('torch'))" 2>/dev/null || true)
case "$torch_version" in
  "") python3 -m pip install -q "torch==2.13.0" ;;
  2.13.* | 2.14.*) ;;
  *)
    echo "setup.sh: torch $torch_version is installed; pycomm supports torch 2.13.x and 2.14.x." >&2
    echo "Install one of them (pip install torch==2.13.0), or use a virtual environment." >&2
    exit 1
    ;;
esac
python3 -m pip install -q ninja pytest pytest-xdist hypothesis numpy matplotlib
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
