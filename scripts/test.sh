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
# 1.5% of one. The native tests run after pytest, on an idle machine, as before.
mkdir -p build
rm -f build/native-build.rc
(
  nice -n 19 bash -c '
    cmake -S . -B build/native -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build/native &&
    cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPYCOMM_SANITIZE=ON &&
    cmake --build build/asan --target test_collectives test_codecs test_block_codec test_codec_simd test_ring \
      test_buffer_list test_queued_collectives test_handshake test_fuzz test_hierarchical_compressed test_matcher \
      test_shrink'
  echo $? > build/native-build.rc
) > build/native-build.log 2>&1 &
builder=$!

# pytest in two parts (tests/conftest.py, PARALLEL_SAFE): the tests that check results only, two
# at a time, then every test with a time bound or machine-wide state, alone. Arguments go to both.
status=0
pytest_part() {
  python3 -m pytest tests -q -p no:cacheprovider --durations=10 "$@"
  local rc=$?
  # Exit code 5 means pytest collected no test: not a failure of the suite.
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then status=1; fi
}
pytest_part -n 2 -m "not serial" "$@"
echo "[phase] pytest, results-only tests two at a time: ${SECONDS} s since the start"
pytest_part -m serial "$@"
echo "[phase] pytest, timed and machine-wide tests alone: ${SECONDS} s since the start"

wait "$builder"
echo "[phase] native builds finished: ${SECONDS} s since the start"
if [ "$(cat build/native-build.rc 2>/dev/null)" != "0" ]; then
  echo "the native builds failed:" >&2
  tail -n 80 build/native-build.log >&2
  exit 1
fi
ctest --test-dir build/native --output-on-failure || status=1
echo "[phase] native tests: ${SECONDS} s since the start"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build/asan --output-on-failure \
  || status=1
echo "[phase] ASan/UBSan tests: ${SECONDS} s since the start"
exit $status
