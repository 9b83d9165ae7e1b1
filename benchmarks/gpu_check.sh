#!/usr/bin/env bash
# GPU check of the CUDA kernels (csrc/cuda): builds tests/cuda/test_kernels.cu with nvcc against the
# kernels and the CPU core's codec sources, runs it, and keeps its output.
#
#   benchmarks/gpu_check.sh [--quick] [--bench-mib N] [--no-torch | --backend-only]
#
# The test compares every kernel with the CPU core element by element, bit for bit, and ends with a
# bandwidth table (GB/s and % of the device's cudaMemcpy device-to-device bandwidth); see the header
# of tests/cuda/test_kernels.cu. The CPU-only check of the kernels' element code,
# tests/cuda/test_element_ops_host.cc, runs first.
#   --quick         skip the sweeps over all 2^32 fp32 inputs (host and device)
#   --bench-mib N   fp32 buffer size of the timing section (default 256)
#   --no-torch      skip the backend part: building the extension against this machine's torch,
#                   tests/test_cuda_staged.py, tests/test_cuda_nccl.py and benchmarks/cuda_staged.py
#                   (all_reduce of CUDA tensors at world 2 on one GPU, staged, against gloo) and
#                   benchmarks/cuda_nccl.py (the NCCL route against torch's NCCL), which run last
#                   otherwise
#   --backend-only  skip the kernel part (for a rerun of the backend part alone)
#
# Times measured on a 16-core machine with an H200: kernel build and checks with --quick about 50 s
# together (the full 2^32 sweeps take much longer), extension build 60 s, tests/test_cuda_staged.py
# 20 s, tests/test_cuda_nccl.py 35 s, cuda_staged.py 15 s, cuda_nccl.py 80 s (its sizes up to 256 MiB).
#
# Output: $OUT/gpu_check.txt if OUT is set (a folder), else benchmarks/results/gpu_check.txt.
# Build products: build/gpu_check/. Environment: NVCC (default nvcc), GPU_ARCH (default: native,
# falling back to the compute capability nvidia-smi reports).
# Exit status: 0 all passed, or no GPU here (nvidia-smi missing: a message, nothing checked);
# 1 a mismatch, a build failure or a failure of the backend part; 2 a CUDA runtime error in the
# kernel checks. A failure of the kernel part does not stop the backend part, nor the reverse.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

QUICK=0
SKIP_TORCH=0
BACKEND_ONLY=0
TEST_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) QUICK=1; TEST_ARGS+=(--quick); shift ;;
    --bench-mib) TEST_ARGS+=(--bench-mib "$2"); shift 2 ;;
    --no-torch) SKIP_TORCH=1; shift ;;
    --backend-only) BACKEND_ONLY=1; shift ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 1 ;;
  esac
done

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu_check: no GPU (nvidia-smi not found); nothing checked"
  exit 0
fi
if ! GPU_LIST="$(nvidia-smi -L 2>&1)" || [[ -z "$GPU_LIST" ]]; then
  echo "gpu_check: no GPU (nvidia-smi -L failed: ${GPU_LIST:-no output}); nothing checked"
  exit 0
fi

NVCC="${NVCC:-nvcc}"
NVCC_FOUND=1
if ! command -v "$NVCC" >/dev/null 2>&1; then
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then NVCC=/usr/local/cuda/bin/nvcc; else NVCC_FOUND=0; fi
fi
CXX="${CXX:-g++}"

if [[ -n "${OUT:-}" ]]; then
  mkdir -p "$OUT"
  RESULT="$OUT/gpu_check.txt"
else
  mkdir -p benchmarks/results
  RESULT="benchmarks/results/gpu_check.txt"
fi

BUILD="build/gpu_check"
mkdir -p "$BUILD/core" "$BUILD/cuda"
JOBS="$(nproc 2>/dev/null || echo 4)"

# The core's compile options, as CMakeLists.txt gives them (-ffp-contract=off matters for exactness).
CORE_FLAGS="$(sed -n 's/^target_compile_options(pycomm_core PRIVATE \(.*\))$/\1/p' CMakeLists.txt | head -n 1)"
CORE_FLAGS="${CORE_FLAGS:--O3 -ffp-contract=off -Wno-unused-parameter}"

# GPU architecture: -arch=native where this nvcc knows it, else the reported compute capability.
ARCH_FLAG="-arch=${GPU_ARCH:-native}"
if [[ $NVCC_FOUND -eq 1 && -z "${GPU_ARCH:-}" ]] && ! echo 'int main(){}' | "$NVCC" -arch=native -x cu - -o "$BUILD/arch_probe" >/dev/null 2>&1; then
  CC="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')"
  ARCH_FLAG="-arch=sm_${CC:-90}"
fi
NVCC_FLAGS=(-std=c++17 -O3 "$ARCH_FLAG" -Icsrc -lineinfo)

COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo '?')"
git diff --quiet 2>/dev/null || COMMIT="$COMMIT+dirty"
{
  echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $COMMIT"
  echo "$GPU_LIST"
  if [[ $NVCC_FOUND -eq 1 ]]; then "$NVCC" --version | tail -n 2; else echo "nvcc: not found"; fi
  echo "nvcc ${NVCC_FLAGS[*]}; core: $CXX $CORE_FLAGS"
} | tee "$RESULT"

# The kernels: built with nvcc, checked against the CPU core, timed. Sets host_rc and dev_rc.
run_kernel_checks() {
echo "gpu_check: building (${JOBS} jobs)"
build_log="$BUILD/build.log"
: > "$build_log"
pids=()
for src in csrc/core/dtype.cc csrc/core/codecs/*.cc; do
  # shellcheck disable=SC2086
  "$CXX" -std=c++17 $CORE_FLAGS -Icsrc -c "$src" -o "$BUILD/core/$(basename "${src%.cc}").o" >>"$build_log" 2>&1 &
  pids+=($!)
done
for src in csrc/cuda/*.cu; do
  "$NVCC" "${NVCC_FLAGS[@]}" -c "$src" -o "$BUILD/cuda/$(basename "${src%.cu}").o" >>"$build_log" 2>&1 &
  pids+=($!)
done
"$NVCC" "${NVCC_FLAGS[@]}" -c tests/cuda/test_kernels.cu -o "$BUILD/test_kernels.o" >>"$build_log" 2>&1 &
pids+=($!)
"$CXX" -std=c++17 $CORE_FLAGS -pthread -Icsrc tests/cuda/test_element_ops_host.cc csrc/core/dtype.cc csrc/core/codecs/*.cc \
  -o "$BUILD/test_element_ops_host" >>"$build_log" 2>&1 &
pids+=($!)
build_ok=1
for pid in "${pids[@]}"; do wait "$pid" || build_ok=0; done
if [[ $build_ok -ne 1 ]]; then
  cat "$build_log" | tee -a "$RESULT"
  echo "gpu_check: FAIL (build)" | tee -a "$RESULT"
  dev_rc=1
  return
fi
rm -f "$BUILD/libcore.a"
ar rcs "$BUILD/libcore.a" "$BUILD"/core/*.o
"$NVCC" "$ARCH_FLAG" "$BUILD/test_kernels.o" "$BUILD"/cuda/*.o "$BUILD/libcore.a" -lpthread -o "$BUILD/test_kernels" >>"$build_log" 2>&1 || {
  cat "$build_log" | tee -a "$RESULT"
  echo "gpu_check: FAIL (link)" | tee -a "$RESULT"
  dev_rc=1
  return
}

set +e
echo "== host: element code vs the CPU core ==" | tee -a "$RESULT"
HOST_ARGS=()
[[ $QUICK -eq 1 ]] && HOST_ARGS+=(--quick)
"$BUILD/test_element_ops_host" ${HOST_ARGS[@]+"${HOST_ARGS[@]}"} 2>&1 | tee -a "$RESULT"
host_rc=${PIPESTATUS[0]}
echo "== device: kernels vs the CPU core ==" | tee -a "$RESULT"
"$BUILD/test_kernels" ${TEST_ARGS[@]+"${TEST_ARGS[@]}"} 2>&1 | tee -a "$RESULT"
dev_rc=${PIPESTATUS[0]}
set -e
}

host_rc=0
dev_rc=0
if [[ $BACKEND_ONLY -eq 1 ]]; then
  echo "== kernels: skipped (--backend-only) ==" | tee -a "$RESULT"
elif [[ $NVCC_FOUND -eq 0 ]]; then
  echo "== kernels: not checked: a GPU is present but nvcc is not found (set NVCC) ==" | tee -a "$RESULT"
  dev_rc=1
else
  run_kernel_checks
fi

# The backend with CUDA tensors (staged through pinned host memory): build the extension against this
# machine's torch, run the CUDA tests, then time all_reduce at world 2 on this GPU against gloo.
staged_rc=0
if [[ $SKIP_TORCH -eq 1 ]]; then
  echo "== backend: skipped (--no-torch) ==" | tee -a "$RESULT"
elif ! python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "== backend: not checked: nvidia-smi lists a GPU but python3's torch sees none ==" | tee -a "$RESULT"
  staged_rc=1
else
  echo "== backend: CUDA tensors (staged), build ==" | tee -a "$RESULT"
  set +e
  # Built in place and imported through PYTHONPATH: `pip install -e .` wants setuptools from the
  # package index for its editable wheel, and the GPU machine reaches none.
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  # NCCL as torch's wheel brings it (the one that ran on the H200), unless PYCOMM_NCCL_LIBRARY names one.
  if [[ -z "${PYCOMM_NCCL_LIBRARY:-}" ]]; then
    nccl_lib="$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)"
    [[ -n "$nccl_lib" && -f "$nccl_lib" ]] && export PYCOMM_NCCL_LIBRARY="$nccl_lib"
  fi
  MAX_JOBS="$JOBS" python3 setup.py -q build_ext --inplace >"$BUILD/extension.log" 2>&1
  cuda_ext_rc=$?
  ext_rc=$cuda_ext_rc
  tail -n 5 "$BUILD/extension.log" | tee -a "$RESULT"
  if [[ $cuda_ext_rc -ne 0 ]]; then
    # The staged path needs no kernels: check it with a CPU-only extension rather than not at all.
    echo "gpu_check: the CUDA extension did not build; the backend is checked with PYCOMM_NO_CUDA=1" | tee -a "$RESULT"
    PYCOMM_NO_CUDA=1 MAX_JOBS="$JOBS" python3 setup.py -q build_ext --inplace >>"$BUILD/extension.log" 2>&1
    ext_rc=$?
  fi
  if [[ $ext_rc -eq 0 ]]; then
    python3 -c 'import pycomm; print("pycomm.cuda_available():", pycomm.cuda_available())' 2>&1 | tee -a "$RESULT"
    echo "== backend: tests/test_extension_link.py ==" | tee -a "$RESULT"
    python3 -m pytest -q -p no:cacheprovider tests/test_extension_link.py 2>&1 | tail -n 10 | tee -a "$RESULT"
    staged_rc=${PIPESTATUS[0]}
    echo "== backend: tests/test_cuda_staged.py ==" | tee -a "$RESULT"
    python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda_staged.py 2>&1 | tail -n 30 | tee -a "$RESULT"
    [[ ${PIPESTATUS[0]} -ne 0 && $staged_rc -eq 0 ]] && staged_rc=1
    # NCCL needs the CUDA extension; on one GPU the test gives each rank its own NCCL_HOSTID.
    echo "== backend: tests/test_cuda_nccl.py (collectives over NCCL point-to-point) ==" | tee -a "$RESULT"
    python3 -m pytest -q -p no:cacheprovider tests/test_cuda_nccl.py 2>&1 | tail -n 30 | tee -a "$RESULT"
    [[ ${PIPESTATUS[0]} -ne 0 && $staged_rc -eq 0 ]] && staged_rc=1
    echo "== backend: all_reduce, world 2 on one GPU, pycomm (staged) vs gloo ==" | tee -a "$RESULT"
    python3 benchmarks/cuda_staged.py 2>&1 | tee -a "$RESULT"
    [[ ${PIPESTATUS[0]} -ne 0 && $staged_rc -eq 0 ]] && staged_rc=1
    if [[ $cuda_ext_rc -eq 0 ]]; then
      echo "== backend: all_reduce, world 2 on one GPU, pycomm's NCCL route vs torch's NCCL ==" | tee -a "$RESULT"
      python3 benchmarks/cuda_nccl.py 2>&1 | tee -a "$RESULT"
      [[ ${PIPESTATUS[0]} -ne 0 && $staged_rc -eq 0 ]] && staged_rc=1
    fi
    [[ $cuda_ext_rc -ne 0 && $staged_rc -eq 0 ]] && staged_rc=1  # the CUDA extension's build failure stands
  else
    staged_rc=1
  fi
  set -e
fi

rc=$dev_rc
[[ $rc -eq 0 && $host_rc -ne 0 ]] && rc=1
[[ $rc -eq 0 && $staged_rc -ne 0 ]] && rc=1
if [[ $rc -eq 0 ]]; then verdict="PASS"; else verdict="FAIL (host $host_rc, device $dev_rc, backend $staged_rc)"; fi
echo "gpu_check: $verdict; results in $RESULT" | tee -a "$RESULT"
exit "$rc"
