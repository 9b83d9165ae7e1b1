#!/usr/bin/env bash
# The test command: native tests of the core (ctest), then the pytest suite against torch.distributed.
# Set PYCOMM_FULL_SWEEP=1 for the exhaustive sweeps. Set PYCOMM_TORCH=<version> (e.g. 2.14.1) to run
# the pytest suite against that torch instead, in a virtual environment of its own (other_torch.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYCOMM_TORCH:-}" ]; then exec ./scripts/other_torch.sh "$PYCOMM_TORCH" "$@"; fi
./scripts/setup.sh || exit 1
echo "[phase] setup and build: ${SECONDS} s"

status=0
cmake -S . -B build/native -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build/native >/dev/null \
  && ctest --test-dir build/native --output-on-failure || status=1
echo "[phase] native tests (with their build): ${SECONDS} s since the start"

# The core's native tests again under AddressSanitizer and UndefinedBehaviorSanitizer.
cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPYCOMM_SANITIZE=ON >/dev/null \
  && cmake --build build/asan --target test_collectives test_codecs test_block_codec test_codec_simd test_ring test_buffer_list test_queued_collectives test_handshake test_fuzz test_hierarchical_compressed test_matcher test_shrink >/dev/null \
  && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build/asan --output-on-failure \
  || status=1
echo "[phase] ASan/UBSan tests (with their build): ${SECONDS} s since the start"

python3 -m pytest tests -q -p no:cacheprovider --durations=15 "$@"
rc=$?
echo "[phase] pytest: ${SECONDS} s since the start"
# Exit code 5 means pytest collected no test: not a failure of the suite.
if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then status=1; fi
exit $status
