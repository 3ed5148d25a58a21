#!/usr/bin/env bash
# Runs the CUDA reducer's checks on a GPU machine (e.g. the device tool's
# NVIDIA H200, sm_90) that has the CUDA driver but no gRPC, Abseil or
# GoogleTest and no network, from a prebuilt bundle. Finishes in under 8
# minutes (every step has its own timeout; see the BUDGET lines).
#
# 1. Here, on the development machine (nvcc installed, no GPU needed):
#
#      bash tests/cuda/make_gpu_bundle.sh [BUILD_DIR]
#
#    builds cuda_reduce_test and halka_cuda_reduce_bench with -DHALKA_CUDA=ON
#    (BUILD_DIR defaults to build-cuda/) and fills bundle/ (git-ignored) with
#    them and the shared libraries they need.
#
# 2. On the GPU machine, from the repository root, with bundle/ beside it.
#    With the device tool, which copies the working tree but not ignored
#    paths unless they are named in `carry`:
#
#      run(command="bash tests/cuda/run_on_gpu.sh", carry=["bundle"],
#          timeout_s=540)
#
# Steps: nvidia-smi; cuobjdump --list-elf/--list-ptx on the test binary
# (expects sm_75, sm_80 and sm_90 machine code); cuda_reduce_test (every
# dtype x op x size x alignment against the CPU reducer, bit for bit);
# a short compute-sanitizer memcheck of a subset of the tests where the
# tool exists and time allows; the benchmark (1 MiB .. 1 GiB, GB/s next to
# device-to-device cudaMemcpy); finalize_avg at 1 GiB on data that does
# not drift (divisor -1); a 4-worker ring on host and on device
# tensors; device_tensor_test; `halkactl bench` 1-256 MiB on host and on
# device tensors (4 worker processes, 4 client threads in one halkactl);
# then a summary table. Logs go to $OUT when
# it is set (the device tool brings them back), else to bundle/results/.
# The exit status is non-zero if the tests failed, were skipped (no usable
# GPU) or could not run.
#
# The binaries come from a Debian 12 build (glibc 2.36). If they cannot start
# with the GPU machine's own glibc, the script runs them through the bundled
# loader (bundle/glibc/ld-linux-x86-64.so.2) instead, with the driver's
# libcuda from the machine (HALKA_BUNDLED_GLIBC=1 forces that).
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/cuda/bundle_loader.sh
source "$REPO/tests/cuda/bundle_loader.sh"
BUNDLE=${HALKA_BUNDLE:-$REPO/bundle}
RESULTS=${OUT:-$BUNDLE/results}
mkdir -p "$RESULTS"
SUMMARY=$RESULTS/summary.txt
: >"$SUMMARY"
T0=$SECONDS

# BUDGET (seconds). The steps' own timeouts add up to more than 8 minutes
# in the worst case, so every step after the tests also checks the time
# left against DEADLINE (450 s) and is skipped, with a row saying so, when
# it could not finish in time. A normal H200 run takes about 2 minutes.
DEADLINE=450
T_SMI=20
T_OBJDUMP=20
T_PROBE=20
T_TEST=150
T_MEMCHECK=45
T_BENCH=70
T_BENCH2=30
T_RING=60
T_DEVTEST=60
T_PEERS=90
# fits NAME SECONDS: true when a step of that timeout ends before DEADLINE.
fits() { (( SECONDS - T0 + $2 <= DEADLINE )) || { row "$1" "skipped" "not enough time left before ${DEADLINE}s"; return 1; }; }

row() { printf '%-22s %-8s %s\n' "$1" "$2" "$3" >>"$SUMMARY"; }
banner() { echo; echo "=== $* ($((SECONDS - T0)) s)"; }

TEST_BIN=$BUNDLE/bin/cuda_reduce_test
BENCH_BIN=$BUNDLE/bin/halka_cuda_reduce_bench
if [[ ! -x "$TEST_BIN" || ! -x "$BENCH_BIN" ]]; then
  echo "error: no bundle at $BUNDLE; build it with tests/cuda/make_gpu_bundle.sh" \
       "and carry bundle/ to this machine" >&2
  exit 2
fi
[[ -f "$BUNDLE/MANIFEST.txt" ]] && head -7 "$BUNDLE/MANIFEST.txt"

# --- 1. the GPU ------------------------------------------------------------
banner "nvidia-smi"
gpu="?"
if command -v nvidia-smi >/dev/null; then
  timeout "$T_SMI" nvidia-smi 2>&1 | tee "$RESULTS/nvidia-smi.txt"
  gpu=$(timeout "$T_SMI" nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
        --format=csv,noheader 2>/dev/null | head -1)
  row "nvidia-smi" "ok" "${gpu:-?}"
else
  echo "nvidia-smi not found"
  row "nvidia-smi" "missing" ""
fi

# --- 2. which architectures the binary carries -----------------------------
banner "cuobjdump"
if command -v cuobjdump >/dev/null; then
  {
    timeout "$T_OBJDUMP" cuobjdump --list-elf "$TEST_BIN"
    timeout "$T_OBJDUMP" cuobjdump --list-ptx "$TEST_BIN"
  } 2>&1 | tee "$RESULTS/cuobjdump.txt"
  missing=""
  for sm in 75 80 90; do
    grep -q "sm_$sm" "$RESULTS/cuobjdump.txt" || missing="$missing sm_$sm"
  done
  if [[ -z "$missing" ]]; then
    row "fatbin (cuobjdump)" "ok" "sm_75 sm_80 sm_90 ELF + PTX"
  else
    row "fatbin (cuobjdump)" "MISSING" "$missing"
  fi
else
  row "fatbin (cuobjdump)" "skipped" "cuobjdump not installed"
fi

# --- 3. how to start the binaries -----------------------------------------
banner "loader"
if ! bundle_loader "$BUNDLE" "$T_PROBE" "$RESULTS/probe.txt" "$TEST_BIN" --gtest_list_tests; then
  cat "$RESULTS/probe.txt"
  row "start binaries" "FAILED" "neither system nor bundled glibc; see probe.txt"
  cat "$SUMMARY"
  exit 2
fi
mode=$LOADER_MODE
rm -f "$RESULTS/probe.txt"
echo "running with the $mode"
row "start binaries" "ok" "$mode"

# --- 4. the tests ------------------------------------------------------------
banner "cuda_reduce_test"
timeout "$T_TEST" "${RUN[@]}" "$TEST_BIN" --gtest_color=no \
  --gtest_output="xml:$RESULTS/cuda_reduce_test.xml" 2>&1 |
  tee "$RESULTS/cuda_reduce_test.log"
test_rc=${PIPESTATUS[0]}
passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$RESULTS/cuda_reduce_test.log" | tail -1)
failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$RESULTS/cuda_reduce_test.log" | tail -1)
skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$RESULTS/cuda_reduce_test.log" | tail -1)
notes=$(grep -c '^\[   NOTE   \].*NaN' "$RESULTS/cuda_reduce_test.log")
detail="${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped; $notes NaN-payload notes"
if [[ $test_rc -eq 124 ]]; then
  row "cuda_reduce_test" "TIMEOUT" "after ${T_TEST}s; $detail"
elif [[ $test_rc -ne 0 ]]; then
  row "cuda_reduce_test" "FAILED" "rc=$test_rc; $detail"
elif [[ "${skipped:-0}" != 0 ]]; then
  row "cuda_reduce_test" "SKIPPED" "$detail (no usable GPU?)"
else
  row "cuda_reduce_test" "ok" "$detail"
fi
if [[ "${skipped:-0}" != 0 ]] && grep -q 'no CUDA device' "$RESULTS/cuda_reduce_test.log"; then
  # No usable GPU here: nothing after this could run (a dry run on a
  # machine without one stops here).
  grep -m1 'no CUDA device' "$RESULTS/cuda_reduce_test.log"
  row "stopped" "no GPU" "cuda_reduce_test skipped its GPU cases"
  cat "$SUMMARY"
  exit 1
fi

# --- 5. memcheck of a small subset -----------------------------------------
banner "compute-sanitizer memcheck"
if ! command -v compute-sanitizer >/dev/null; then
  row "memcheck" "skipped" "compute-sanitizer not installed"
elif [[ "$mode" != "system glibc" ]]; then
  row "memcheck" "skipped" "binaries run through the bundled loader"
elif (( SECONDS - T0 > 240 )); then
  row "memcheck" "skipped" "not enough time left"
else
  HALKA_CUDA_TEST_MAX_COUNT=5000 timeout "$T_MEMCHECK" \
    compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 \
    "${RUN[@]}" "$TEST_BIN" --gtest_color=no \
    --gtest_filter='*float16_sum*:*bfloat16_max*:*float64_prod*:*int64_min*:*CudaFinalizeAvgTest.MatchesCpuBitForBit/int32*:*CudaReduceArgsTest*' \
    >"$RESULTS/memcheck.log" 2>&1
  mc_rc=$?
  tail -5 "$RESULTS/memcheck.log"
  case $mc_rc in
    0) row "memcheck" "ok" "$(grep -m1 'ERROR SUMMARY' "$RESULTS/memcheck.log")" ;;
    9) row "memcheck" "ERRORS" "$(grep -m1 'ERROR SUMMARY' "$RESULTS/memcheck.log")" ;;
    124) row "memcheck" "timeout" "after ${T_MEMCHECK}s (informational)" ;;
    *) row "memcheck" "n/a" "rc=$mc_rc (the tool may not support this machine)" ;;
  esac
fi

# --- 6. the benchmark ------------------------------------------------------
banner "halka_cuda_reduce_bench"
fits bench "$T_BENCH" && timeout "$T_BENCH" "${RUN[@]}" "$BENCH_BIN" --min_mib=1 --max_mib=1024 --factor=4 \
  2>&1 | tee "$RESULTS/bench.txt"
bench_rc=${PIPESTATUS[0]}
if [[ ! -s "$RESULTS/bench.txt" ]]; then
  :  # skipped, row written by fits
elif [[ $bench_rc -eq 0 ]]; then
  row "bench" "ok" "$(grep -m1 '^summary at' "$RESULTS/bench.txt")"
else
  row "bench" "FAILED" "rc=$bench_rc"
fi

# --- 6a. finalize_avg on data that does not drift: divisor -1 alternates
# the sign, and costs a float division the same instructions as any divisor
# (with divisor 3 the repeated calls drive the buffer to subnormals and
# zeros, which time the slow or the trivial cases).
banner "finalize_avg, divisor -1, 1 GiB"
if fits "finalize_avg -1" "$T_BENCH2"; then
  timeout "$T_BENCH2" "${RUN[@]}" "$BENCH_BIN" --min_mib=1024 --max_mib=1024 \
    --ops=sum --dtypes=float32,float64,float16,bfloat16 --finalize_divisor=-1 \
    >"$RESULTS/bench-finalize.txt" 2>&1 &&
    row "finalize_avg -1" "ok" "summary below" ||
    row "finalize_avg -1" "FAILED" "see bench-finalize.txt"
fi

# --- 6b. a 4-worker ring on the one GPU, device tensors from separate -------
# client processes (CUDA IPC), against the same ring on host buffers.
banner "device-tensor ring (4 workers, 1 GPU)"
BIN=$BUNDLE/bin
# start_cluster NAME PORT: a rendezvous and 4 workers (job NAME, device 0)
# on 127.0.0.1:PORT and PORT+10..13, logs NAME-*.log; sets pids.
start_cluster() {
  local name=$1 port=$2 i
  "${RUN[@]}" "$BIN/halka-rendezvous" --listen=127.0.0.1:$port >"$RESULTS/$name-rv.log" 2>&1 &
  pids+=($!)
  for i in 0 1 2 3; do
    "${RUN[@]}" "$BIN/halka-worker" --rendezvous=127.0.0.1:$port --job=$name \
      --world_size=4 --rank=$i --worker_id=$name$i --listen=127.0.0.1:$((port + 10 + i)) \
      --device=0 >"$RESULTS/$name-w$i.log" 2>&1 &
    pids+=($!)
  done
  sleep 2
}
ring_step() {
  local port=$((17000 + RANDOM % 2000)) pids=() i rc=0
  start_cluster ring "$port"
  for mode in host device; do
    local flag=""
    [[ $mode == device ]] && flag="--device"
    local cpids=()
    for i in 0 1 2 3; do
      timeout 60 "${RUN[@]}" "$BIN/halkactl" allreduce --worker=127.0.0.1:$((port + 10 + i)) \
        --count=16777216 --dtype=float32 --op=sum --algo=ring --repeat=3 $flag \
        >"$RESULTS/ring-$mode-$i.log" 2>&1 &
      cpids+=($!)
    done
    for p in "${cpids[@]}"; do wait "$p" || rc=1; done
  done
  kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null
  local host_ms dev_ms
  host_ms=$(grep -h -o 'worker_ms=[0-9.]*' "$RESULTS"/ring-host-*.log | tail -4 | cut -d= -f2 | sort -n | tail -1)
  dev_ms=$(grep -h -o 'worker_ms=[0-9.]*' "$RESULTS"/ring-device-*.log | tail -4 | cut -d= -f2 | sort -n | tail -1)
  local f
  for f in "$RESULTS"/ring-host-?.log "$RESULTS"/ring-device-?.log; do
    grep -q '#wrong 0' "$f" || rc=1
  done
  if [[ $rc -ne 0 ]]; then
    row "device ring" "FAILED" "see ring-*.log"
  else
    row "device ring" "ok" "64 MiB f32: host ${host_ms} ms, device ${dev_ms} ms (slowest rank, last op)"
  fi
}
# --- 6c. halkactl bench --device: 4 worker processes, one halkactl whose 4
# client threads (one per rank) hand device tensors over CUDA IPC; the same
# sweep on host buffers, then a busbw table next to torch-gloo's CUDA
# tensors on the same kind of machine (tests/cuda/reference/).
peers_step() {
  local port=$((19200 + RANDOM % 2000)) pids=() i rc=0 addrs=""
  start_cluster peers "$port"
  for i in 0 1 2 3; do addrs+="${addrs:+,}127.0.0.1:$((port + 10 + i))"; done
  "${RUN[@]}" "$BIN/halkactl" bench --worker="$addrs" --algo=ring -b 1M -e 256M -f 4 \
    -n 5 -w 1 -c 1 >"$RESULTS/peers-host.txt" 2>&1 || rc=1
  "${RUN[@]}" "$BIN/halkactl" bench --worker="$addrs" --algo=ring -b 1M -e 256M -f 4 \
    -n 5 -w 1 -c 1 --device >"$RESULTS/peers-device.txt" 2>&1 || rc=1
  kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null
  return $rc
}
# peers_table HOST DEVICE [GLOO]: size, busbw of each, device/host.
peers_table() {
  awk -v gloo="${3:-/dev/null}" '
    FILENAME == gloo { if ($1 ~ /^[0-9]+$/) g[$1] = $4; next }
    FNR == 1 { f++ }
    $1 ~ /^[0-9]+$/ && NF >= 9 {
      if (f == 1) { h[$1] = $8 } else { d[$1] = $8; w[$1] = $9; order[++n] = $1 }
    }
    END {
      printf "%-10s %12s %12s %9s %16s %7s\n", "size", "host busbw", "dev busbw",
             "dev/host", "gloo-cuda busbw", "#wrong"
      for (i = 1; i <= n; i++) {
        k = order[i]
        printf "%-10s %12s %12s %8.0f%% %16s %7s\n", (k / 1048576) " MiB", h[k], d[k],
               (h[k] > 0 ? 100 * d[k] / h[k] : 0), ((k in g) ? g[k] : "-"), w[k]
      }
    }' "${3:-/dev/null}" "$1" "$2"
}
if [[ -x "$BIN/halka-worker" ]]; then
  if fits "device ring" "$T_RING"; then
    timeout "$T_RING" bash -c "$(declare -f start_cluster ring_step row banner); RUN=(${RUN[*]}); BUNDLE=$BUNDLE; BIN=$BIN; RESULTS=$RESULTS; SUMMARY=$SUMMARY; ring_step" \
      || row "device ring" "FAILED" "timeout or error"
  fi
  if fits device_tensor_test "$T_DEVTEST"; then
    timeout "$T_DEVTEST" "${RUN[@]}" "$BIN/device_tensor_test" --gtest_color=no \
      >"$RESULTS/device_tensor_test.log" 2>&1
    dt_rc=$?
    # gtest names each skipped test twice; the final list has no "(N ms)".
    dt_skipped=$(grep -cE '^\[  SKIPPED \] DeviceTensors\.[A-Za-z0-9_]+$' "$RESULTS/device_tensor_test.log")
    if [[ $dt_rc -ne 0 ]]; then
      row "device_tensor_test" "FAILED" "rc=$dt_rc; $(grep -m3 '^\[  FAILED  \]' "$RESULTS/device_tensor_test.log" | tr '\n' ' ')"
    elif [[ $dt_skipped -ne 0 ]]; then
      row "device_tensor_test" "SKIPPED" "$dt_skipped GPU tests skipped"
    else
      row "device_tensor_test" "ok" "$(grep -m1 '^\[  PASSED  \]' "$RESULTS/device_tensor_test.log")"
    fi
  fi
  if fits "bench --device" "$T_PEERS"; then
    if timeout "$T_PEERS" bash -c "$(declare -f start_cluster peers_step); RUN=(${RUN[*]}); BIN=$BIN; RESULTS=$RESULTS; peers_step"; then
      wrong=$(awk '$1 ~ /^[0-9]+$/ && NF >= 9 && $9 != 0' "$RESULTS/peers-host.txt" "$RESULTS/peers-device.txt" | wc -l)
      if [[ $wrong -eq 0 ]]; then
        row "bench --device" "ok" "1-256 MiB, 4 worker processes, 4 client threads; table below"
      else
        row "bench --device" "WRONG" "$wrong rows with wrong elements; see peers-*.txt"
      fi
      peers_table "$RESULTS/peers-host.txt" "$RESULTS/peers-device.txt" \
        "$REPO/tests/cuda/reference/torch-gloo-cuda-h200.txt" >"$RESULTS/peers-table.txt"
    else
      row "bench --device" "FAILED" "timeout or error; see peers-*.txt"
    fi
  fi
else
  row "device ring" "skipped" "bundle has no halka binaries"
fi

# --- 7. summary --------------------------------------------------------------
banner "summary"
{
  echo
  echo "total $((SECONDS - T0)) s"
  if grep -q '^summary at' "$RESULTS/bench.txt" 2>/dev/null; then
    echo
    sed -n '/^summary at/,$p' "$RESULTS/bench.txt"
  fi
  if grep -q '^summary at' "$RESULTS/bench-finalize.txt" 2>/dev/null; then
    echo
    echo "finalize_avg with divisor -1 (data that does not drift):"
    sed -n '/^summary at/,$p' "$RESULTS/bench-finalize.txt" | grep -E 'summary|finalize'
  fi
  if [[ -s "$RESULTS/peers-table.txt" ]]; then
    echo
    echo "all-reduce busbw (GB/s), float32 sum, ring, 4 ranks on one GPU:"
    cat "$RESULTS/peers-table.txt"
  fi
} >>"$SUMMARY"
cat "$SUMMARY"
echo "results in $RESULTS"

# Skipped tests on a GPU machine mean the GPU was not usable: a failure too.
[[ $test_rc -eq 0 && "${failed:-0}" == 0 && "${skipped:-0}" == 0 ]] || exit 1
exit 0
