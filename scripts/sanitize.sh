#!/usr/bin/env bash
# The unit and integration suites once under AddressSanitizer and
# UndefinedBehaviorSanitizer: configures build-asan with
# -DHALKA_SANITIZE=address,undefined, builds, runs ctest. Any sanitizer
# report aborts the test that made it, so the run fails.
#
#   scripts/sanitize.sh                 # ctest -L 'unit|integration'
#   scripts/sanitize.sh -R security     # other ctest arguments instead
# Environment: HALKA_ASAN_BUILD_DIR (default build-asan), HALKA_ASAN_JOBS
# (parallel build jobs, default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${HALKA_ASAN_BUILD_DIR:-$root/build-asan}
jobs=${HALKA_ASAN_JOBS:-1}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DHALKA_CUDA=OFF -DHALKA_SANITIZE=address,undefined >/dev/null
fi
ninja -C "$build" -j"$jobs"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/tests/sanitizer/lsan.supp}
# ring_grpc_test's soak case measures RSS growth, which ASan's quarantine
# and allocator caches inflate (+20..50 MB, no leak): LeakSanitizer is the
# leak check here.
export GTEST_FILTER=${GTEST_FILTER:--Soak.ThousandBackToBackSmallAllReducesLeakNothing}
cd "$build"
if [ $# -eq 0 ]; then set -- -L 'unit|integration'; fi
# Sanitized code runs several times slower: generous per-test timeout.
exec ctest --output-on-failure --timeout 2400 "$@"
