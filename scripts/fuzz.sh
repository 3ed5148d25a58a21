#!/usr/bin/env bash
# Builds halka's libFuzzer targets with clang (ASan + UBSan) in build-fuzz
# and runs each for SECONDS (default 300) from its committed seed corpus.
# Any crash, leak, timeout or sanitizer report fails (exit 1) and leaves the
# input under build-fuzz/artifacts/.
#
#   scripts/fuzz.sh            # 300 s per target
#   scripts/fuzz.sh 20         # the short run CTest's fuzz_short does
#   scripts/fuzz.sh --corpus   # rewrite the seed corpora and exit
# Environment: HALKA_FUZZ_BUILD_DIR (default build-fuzz), HALKA_FUZZ_JOBS
# (parallel build jobs, default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
seconds=${1:-300}
build=${HALKA_FUZZ_BUILD_DIR:-$root/build-fuzz}
jobs=${HALKA_FUZZ_JOBS:-1}
targets=(frame_decoder_fuzz rendezvous_requests_fuzz worker_requests_fuzz)

if ! command -v clang++ >/dev/null; then
  echo "fuzz.sh: clang++ not found (apt-get install clang); skipped" >&2
  exit 77
fi
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DHALKA_CUDA=OFF -DHALKA_BUILD_TESTS=OFF -DHALKA_FUZZ=ON >/dev/null
fi
if ! ninja -C "$build" -j"$jobs" "${targets[@]}" halka_make_corpus \
    >"$build/fuzz-build.log" 2>&1; then
  echo "fuzz.sh: building the fuzz targets failed:" >&2
  grep -E "error|FAILED" -A3 "$build/fuzz-build.log" | head -n 40 >&2
  exit 1
fi

if [ "$seconds" = "--corpus" ]; then
  "$build/tests/fuzz/halka_make_corpus" "$root/tests/fuzz/corpus"
  exit 0
fi

mkdir -p "$build/artifacts"
status=0
for t in "${targets[@]}"; do
  work="$build/corpus/$t"      # grows while fuzzing; the seeds stay as committed
  mkdir -p "$work"
  echo "fuzz.sh: $t for ${seconds}s"
  if ! "$build/tests/fuzz/$t" "$work" "$root/tests/fuzz/corpus/$t" \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -max_len=70000 -print_final_stats=1 \
      -artifact_prefix="$build/artifacts/$t-" >"$build/$t.log" 2>&1; then
    echo "fuzz.sh: $t FAILED; see $build/$t.log and $build/artifacts/" >&2
    tail -40 "$build/$t.log" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|cov:" "$build/$t.log" | tail -2
  fi
done
exit $status
