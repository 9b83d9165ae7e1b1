#!/usr/bin/env bash
# The test command: the pytest suite against torch.distributed, then the native tests of the core
# (ctest), plain and under AddressSanitizer and UndefinedBehaviorSanitizer.
# Set PYCOMM_FULL_SWEEP=1 for the exhaustive sweeps. Set PYCOMM_TORCH=<version> (e.g. 2.14.1) to run
# the pytest suite against that torch instead, in a virtual environment of its own (other_torch.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYCOMM_TORCH:-}" ]; then exec ./scripts/other_torch.sh "$PYCOMM_TORCH" "$@"; fi
./scripts/setup.sh || exit 1
echo "[phase] setup and build: ${SECONDS} s"

# The two native trees build in the background, at the lowest priority, while pytest runs: pytest's
# ranks spend about a third of their time waiting (for each other, for timeouts a test provokes), and
# the compilers take those idle cycles; when pytest wants both cores, a nice 19 compiler gets about
# 1.5% of one. The native tests (ASan/UBSan: tests/README) run after pytest, on an idle machine.
mkdir -p build
rm -f build/native-build.rc build/asan-build.rc
# Its own process group (setsid), so that the trap below stops every compiler it started.
setsid nice -n 19 bash -c '
    cmake -S . -B build/native -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build/native -j 2
    echo $? > build/native-build.rc
    cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPYCOMM_SANITIZE=ON >/dev/null &&
      cmake --build build/asan -j 2 --target test_collectives test_codecs test_block_codec test_codec_simd test_ring \
        test_buffer_list test_queued_collectives test_handshake test_fuzz test_hierarchical_compressed test_matcher \
        test_ring_links test_shrink
    echo $? > build/asan-build.rc' > build/native-build.log 2>&1 &
builder=$!
# The builder ends with this script, however it ends (a CI timeout's SIGTERM included).
trap 'kill -- -$builder 2>/dev/null' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

status=0
pytest_run() {
  python3 -m pytest tests -q -p no:cacheprovider --durations=10 "$@"
  local rc=$?
  # Exit code 5 means pytest collected no test: not a failure of the suite.
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then status=1; fi
}
if [ "$#" -gt 0 ]; then
  # Arguments select tests: one plain run with them.
  pytest_run "$@"
  echo "[phase] pytest: ${SECONDS} s since the start"
else
  # Two parts (tests/conftest.py, PARALLEL_SAFE): the files that check results only, two at a time
  # (a file's tests on one worker, so its module fixtures run once), then every other test alone.
  pytest_run -n 2 --dist loadfile -m "not serial"
  echo "[phase] pytest, results-only files two at a time: ${SECONDS} s since the start"
  pytest_run -m serial
  echo "[phase] pytest, timed and machine-wide tests alone: ${SECONDS} s since the start"
fi

wait "$builder"
echo "[phase] native builds finished: ${SECONDS} s since the start"
native_tests() {  # $1: tree, the rest: the environment of its tests
  local tree=$1
  shift
  if [ "$(cat "build/$tree-build.rc" 2>/dev/null)" != "0" ]; then
    echo "the $tree build failed (build/native-build.log):" >&2
    grep -B2 -A8 -E "error|FAILED" build/native-build.log | tail -n 60 >&2
    status=1
    return
  fi
  env "$@" ctest --test-dir "build/$tree" --output-on-failure || status=1
  echo "[phase] $tree tests: ${SECONDS} s since the start"
}
native_tests native
native_tests asan ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
exit $status
