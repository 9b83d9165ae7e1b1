#!/usr/bin/env bash
# Opt-in check that the torch adapter (csrc/torch) compiles against some torch's headers, without
# building: g++ -fsyntax-only of all the adapter's files as one translation unit, with the CUDA
# paths off, then on where the CUDA runtime's headers are found. It costs one parse of torch's
# headers per variant (see the README's "Supported torch versions" for measured times), against
# minutes for a build, and is not part of scripts/test.sh.
#   scripts/check_adapter_syntax.sh                                   # the torch of python3
#   scripts/check_adapter_syntax.sh build/venv-torch2.14.1/bin/python  # another torch
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-python3}

# The flags setup.py's build gives the adapter: torch.utils.cpp_extension's include paths, ABI and
# defines, and C++20 (setup.py's CXX_FLAGS says why).
read -r version abi includes < <("$python" - <<'EOF'
import sysconfig
import torch
from torch.utils.cpp_extension import include_paths
dirs = include_paths() + [sysconfig.get_paths()["include"]]
print(torch.__version__, int(torch._C._GLIBCXX_USE_CXX11_ABI), ",".join(dirs))
EOF
)
flags=(-fsyntax-only -x c++ -std=c++20 -Wno-unused-parameter -Icsrc
  -DTORCH_EXTENSION_NAME=_C -DTORCH_API_INCLUDE_EXTENSION_H "-D_GLIBCXX_USE_CXX11_ABI=$abi")
IFS=, read -r -a dirs <<<"$includes"
for dir in "${dirs[@]}"; do flags+=(-isystem "$dir"); done

# One unit including every adapter file: torch's headers are parsed once, not once per file.
unit=$(mktemp --suffix=.cc)
trap 'rm -f "$unit"' EXIT
for file in csrc/torch/*.cc; do echo "#include \"${file#csrc/}\""; done >"$unit"

status=0
check() {
  local name=$1; shift
  local start=$SECONDS
  if "${CXX:-g++}" "${flags[@]}" "$@" "$unit"; then
    echo "[adapter syntax] torch $version, $name: ok in $((SECONDS - start)) s"
  else
    echo "[adapter syntax] torch $version, $name: FAILED after $((SECONDS - start)) s"
    status=1
  fi
}
check "CPU paths"
cuda_include=${CUDA_HOME:-/usr/local/cuda}/include
if [ -f "$cuda_include/cuda_runtime_api.h" ]; then
  check "CUDA paths" -DPYCOMM_WITH_CUDA=1 -isystem "$cuda_include"
else
  echo "[adapter syntax] CUDA paths skipped: no cuda_runtime_api.h under $cuda_include"
fi
exit $status
