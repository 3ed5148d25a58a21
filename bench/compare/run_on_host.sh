#!/usr/bin/env bash
# Issue 16's measurements on a machine that has none of halka's libraries,
# no Gloo and no network (the device tool's 16-core H200 host), from the
# bundle tests/cuda/make_gpu_bundle.sh builds here (halkactl, gloo_bench,
# their libraries, throwaway TLS certificates):
#
#   here:   bash tests/cuda/make_gpu_bundle.sh
#   there:  run(command="bash bench/compare/run_on_host.sh", carry=["bundle"],
#               timeout_s=450)
#
# Steps, in order of importance, each under its own timeout, all ending
# before DEADLINE (390 s; a step whose timeout would not fit is skipped
# with a line saying so; every timeout also kills what the step started):
#   1. the machine: cores, memory, kernel, load
#   2. one loopback TCP stream without halka (python3 sendall/recv_into,
#      at most 4 GiB or 10 s): the per-edge ceiling there
#   3. halka against Gloo, TCP against TCP: bench/compare/compare.sh
#      --min 256K --max 256M, halka with --shm_links=false, G = 4 then G = 8
#      (each its own run, so that one past its time loses only itself);
#      Open MPI (tcp, then vader) in the same run only where the bundle has
#      a prebuilt bin/mpi_bench and this machine has Open MPI's mpirun (the
#      bundle cannot carry Open MPI's runtime), else a row saying it is
#      skipped
#   4. 4 KiB at G = 4, three runs of 1,000 operations, then one each with
#      the rings polled 20 and 50 µs before sleeping (--shm_spin_us)
#   5. TLS: the sealing's own rate (halka-seal-bench: OpenSSL's OCB, the
#      default engine, and the opt-in VAES-512 where the host takes it),
#      then G = 4, 1-64 MiB over TCP, plaintext then mutual TLS
#      (--tls --tls_dir bundle/certs; the default engine)
#   6. halka as users get it on one host (same-host shared-memory links), the
#      same sizes, next to step 3's Gloo figures
# Everything goes to $OUT (the device tool brings it back), else to
# bundle/results-host: summary.txt, written row by row, and host16.tar.gz
# (every log and table), written on any exit, a killed one too.
# Exit status: 0 when every step that ran finished with #wrong 0, 1 when a
# step failed or a result was wrong, 2 when the bundle cannot run here.
# Locally, `--quick` runs the same steps on small sizes (a check of the
# script, not a measurement).
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/cuda/bundle_loader.sh
source "$REPO/tests/cuda/bundle_loader.sh"
BUNDLE=${HALKA_BUNDLE:-$REPO/bundle}
RESULTS=${OUT:-$BUNDLE/results-host}
QUICK=0
[[ "${1:-}" == --quick ]] && QUICK=1
mkdir -p "$RESULTS"
LOGS=$(mktemp -d /tmp/halka-host.XXXXXX)
SUMMARY=$RESULTS/summary.txt
: >"$SUMMARY"
pack() {
  cp "$SUMMARY" "$LOGS/summary.txt" 2>/dev/null
  tar -czf "$RESULTS/host16.tar.gz" -C "$LOGS" . 2>/dev/null
  rm -rf "$LOGS"
}
trap pack EXIT
trap 'exit 143' TERM INT
T0=$SECONDS
DEADLINE=390
FAILED=0
MAX=256M
SIZES_TLS=(-b 1M -e 64M)
N_SMALL=1000
if [[ $QUICK == 1 ]]; then
  MAX=1M
  SIZES_TLS=(-b 1M -e 1M)
  N_SMALL=50
fi

row() { printf '%-26s %-8s %s\n' "$1" "$2" "$3" | tee -a "$SUMMARY"; }
fits() {
  (( SECONDS - T0 + $2 <= DEADLINE )) && return 0
  row "$1" "skipped" "not enough time left before ${DEADLINE}s"
  return 1
}
# verdict NAME RC OK_TEXT FAIL_TEXT: the step's row, ok when RC is 0.
verdict() {
  if [[ $2 -eq 0 ]]; then
    row "$1" "ok" "$3"
  else
    row "$1" "FAILED" "$4"
    FAILED=1
  fi
}
# Rows of a halkactl bench table whose #wrong column is not 0.
wrong_rows() { awk '$1 ~ /^[0-9]+$/ && NF >= 9 && $9 != 0' "$@" | wc -l; }

HALKACTL=$BUNDLE/bin/halkactl
GLOO=$BUNDLE/bin/gloo_bench
if [[ ! -x "$HALKACTL" ]]; then
  row "start binaries" "FAILED" "no $HALKACTL: build the bundle with tests/cuda/make_gpu_bundle.sh and carry bundle/"
  exit 2
fi
if ! bundle_loader "$BUNDLE" 30 "$LOGS/probe.txt" "$HALKACTL" bench --workers=2 \
     -b 4K -e 4K -n 1 -w 0; then
  cat "$LOGS/probe.txt" >&2
  row "start binaries" "FAILED" "the bundle's halkactl does not run here (probe.txt)"
  exit 2
fi
# Wrappers, so that compare.sh runs the bundled binaries through RUN.
for b in halkactl gloo_bench halka-seal-bench; do
  [[ $b == halka-seal-bench && ! -x "$BUNDLE/bin/$b" ]] && continue
  printf '#!/usr/bin/env bash\nexec %s %q "$@"\n' "$(printf '%q ' "${RUN[@]}")" \
    "$BUNDLE/bin/$b" >"$LOGS/$b"
  chmod +x "$LOGS/$b"
done
PY=python3
command -v "$PY" >/dev/null || PY=/usr/bin/python3

# --- 1. the machine ----------------------------------------------------------
{
  echo "date: $(date -u +%FT%TZ)"
  echo "cores: $(nproc); kernel: $(uname -r); load: $(cut -d' ' -f1-3 /proc/loadavg)"
  grep -E '^(MemTotal|MemAvailable)' /proc/meminfo
  grep -m1 'model name' /proc/cpuinfo
  command -v nvidia-smi >/dev/null && timeout -k 2 20 nvidia-smi -L
  echo "loader: $LOADER_MODE"
  [[ -f "$BUNDLE/MANIFEST.txt" ]] && head -7 "$BUNDLE/MANIFEST.txt"
} >"$LOGS/machine.txt" 2>&1
# Which path same-host frames take here: the workers say so only when the
# rings' readers hand them over (no futex_waitv: an older kernel, gVisor).
RINGS=$(grep -ho 'same-host links: [^(]*' "$LOGS/probe.txt" | head -1 | sed 's/ *$//')
RINGS=${RINGS:-"same-host links: the operation's thread takes its rings' frames (futex_waitv)"}
echo "$RINGS" >>"$LOGS/machine.txt"
cat "$LOGS/machine.txt"
row "machine" "ok" "$(nproc) cores, $(uname -r), $LOADER_MODE; ${RINGS#same-host links: }"

# --- 2. one loopback TCP stream ---------------------------------------------
if fits "tcp stream" 30; then
  timeout -k 5 30 "$PY" - >"$LOGS/tcp-stream.txt" 2>&1 <<'PY'
import socket, threading, time
LIMIT, SECONDS, CHUNK = 4 << 30, 10.0, 4 << 20
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
got = [0]
def sink():
    c, _ = srv.accept()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while True:
        n = c.recv_into(view)
        if n == 0:
            break
        got[0] += n
t = threading.Thread(target=sink)
t.start()
s = socket.create_connection(srv.getsockname())
data = b"\x5a" * CHUNK
sent, t0 = 0, time.monotonic()
while sent < LIMIT and time.monotonic() - t0 < SECONDS:
    s.sendall(data)
    sent += CHUNK
s.close()
t.join()
dt = time.monotonic() - t0
print(f"one loopback TCP stream: {got[0] / dt / 1e9:.2f} GB/s "
      f"({got[0] >> 20} MiB in {dt:.2f} s, python sendall/recv_into, 4 MiB writes)")
PY
  rc=$?
  verdict "tcp stream" "$rc" "$(cut -d: -f2- "$LOGS/tcp-stream.txt")" \
    "rc=$rc: $(tail -1 "$LOGS/tcp-stream.txt")"
fi

# --- 3. halka against Gloo, TCP against TCP ---------------------------------
# Open MPI: a bundled mpi_bench runs with this machine's own Open MPI (its
# mpirun, orted and libmpi; not through the bundle's loader), so only where
# there is one.
MPI_SIDE=(--no-mpi)
STEP3=215
if [[ ! -x "$BUNDLE/bin/mpi_bench" ]]; then
  row "open mpi" "skipped" "the bundle has no bin/mpi_bench (bench/compare/mpi_bench.cc, built with mpicxx); halka vs Gloo only"
elif ! command -v mpirun >/dev/null; then
  row "open mpi" "skipped" "no mpirun on this machine (Open MPI is not installed here); halka vs Gloo only"
else
  MPI_SIDE=(--mpi-bench "$BUNDLE/bin/mpi_bench" --mpirun "$(command -v mpirun)")
  STEP3=300
  row "open mpi" "ok" "$(mpirun --version 2>/dev/null | head -1); tcp and vader in step 3's runs"
fi
for g in 4 8; do
  if [[ ! -x "$GLOO" ]]; then
    row "vs gloo G=$g (tcp)" "skipped" "the bundle has no gloo_bench (libgloo-dev was not installed where it was built)"
  elif fits "vs gloo G=$g (tcp)" "$STEP3"; then
    timeout -k 5 $((STEP3 - 5)) bash "$REPO/bench/compare/compare.sh" --halkactl "$LOGS/halkactl" \
      --gloo-bench "$LOGS/gloo_bench" "${MPI_SIDE[@]}" --worlds "$g" --min 256K --max "$MAX" \
      --iters 10 --warmup 20 --timeout 100 --halka-args "--shm_links=false" \
      --out "$LOGS/compare-tcp" >"$LOGS/compare-tcp-$g.txt" 2>&1
    rc=$?
    verdict "vs gloo G=$g (tcp)" "$rc" "256K-$MAX; table in compare-tcp-$g.txt" \
      "rc=$rc; see compare-tcp-$g.txt"
  fi
done

# --- 4. 4 KiB at G = 4 ------------------------------------------------------
if fits "4 KiB G=4" 100; then
  # Three runs as users get it, then one each polling the rings 20 and
  # 50 µs before sleeping (--shm_spin_us: pays only with idle cores).
  times=""
  rc=0
  for run in 1:0 2:0 3:0 4:20 5:50; do
    i=${run%%:*}
    spin=${run#*:}
    timeout -k 2 18 "$LOGS/halkactl" bench --workers=4 -b 4K -e 4K -n "$N_SMALL" -w 100 \
      --shm_spin_us="$spin" >"$LOGS/small-$i.txt" 2>&1 || rc=1
    times+="$(awk '$1 == 4096 {print $6}' "$LOGS/small-$i.txt")"
    [[ $spin != 0 ]] && times+=" (spin ${spin} µs)"
    times+="; "
    (( $(wrong_rows "$LOGS/small-$i.txt") == 0 )) || rc=1
  done
  verdict "4 KiB G=4" "$rc" "µs per operation: $times" "see small-*.txt"
fi

# --- 5. TLS ------------------------------------------------------------------
if [[ ! -f "$BUNDLE/certs/localhost.pem" ]]; then
  row "tls" "skipped" "the bundle has no certs/"
elif fits "tls" 90; then
  rc=0
  if [[ -x "$BUNDLE/bin/halka-seal-bench" ]]; then
    timeout -k 5 20 "$LOGS/halka-seal-bench" 0.03 >"$LOGS/seal.txt" 2>&1 || rc=1
  fi
  timeout -k 5 40 "$LOGS/halkactl" bench --workers=4 "${SIZES_TLS[@]}" -f 4 -n 10 -w 5 \
    --shm_links=false >"$LOGS/tls-plain.txt" 2>&1 || rc=1
  timeout -k 5 40 "$LOGS/halkactl" bench --workers=4 "${SIZES_TLS[@]}" -f 4 -n 10 -w 5 \
    --shm_links=false --tls --tls_dir="$BUNDLE/certs" >"$LOGS/tls-mtls.txt" 2>&1 || rc=1
  (( $(wrong_rows "$LOGS/tls-plain.txt" "$LOGS/tls-mtls.txt") == 0 )) || rc=1
  if [[ $rc -eq 0 ]]; then
    awk 'FNR == 1 { f++ } $1 ~ /^[0-9]+$/ && NF >= 9 { b[f, $1] = $8; s[$1] = 1 }
         END { printf "size plaintext mtls cost\n";
               for (k in s) printf "%d %s %s %.0f%%\n", k, b[1, k], b[2, k],
                 (b[1, k] > 0 ? 100 * (1 - b[2, k] / b[1, k]) : 0) }' \
      "$LOGS/tls-plain.txt" "$LOGS/tls-mtls.txt" | sort -n >"$LOGS/tls.txt"
  fi
  verdict "tls" "$rc" "busbw plaintext / mutual TLS by size in tls.txt" \
    "see tls-plain.txt, tls-mtls.txt"
fi

# --- 6. halka as users get it on one host -----------------------------------
shm_ran=""
for g in 4 8; do
  fits "halka same-host G=$g" 85 || continue
  timeout -k 5 80 "$LOGS/halkactl" bench --workers=$g -b 256K -e "$MAX" -f 4 -n 10 \
    -w 20 --json >"$LOGS/halka-shm-$g.json" 2>"$LOGS/halka-shm-$g.log"
  rc=$?
  (( rc == 0 )) && shm_ran+="$g "
  verdict "halka same-host G=$g" "$rc" "256K-$MAX; table below" \
    "rc=$rc; see halka-shm-$g.log"
done
if [[ -n "$shm_ran" ]]; then
  "$PY" - "$LOGS" $shm_ran >"$LOGS/shm-vs-gloo.txt" 2>&1 <<'PY'
import json, os, sys
logs, worlds = sys.argv[1], [int(g) for g in sys.argv[2:]]
def rows(path):
    out = {}
    if os.path.exists(path):
        for line in open(path):
            if line.startswith("{"):
                r = json.loads(line)
                out[r["size"]] = r
    return out
bad = 0
print("busbw GB/s: halka with same-host links / Gloo over TCP (step 3's "
      "run; halka alone where step 3 has no figure)")
for g in worlds:
    h = rows(os.path.join(logs, f"halka-shm-{g}.json"))
    o = rows(os.path.join(logs, "compare-tcp", f"gloo-{g}.json"))
    cells = []
    for s in sorted(h):
        bad += 1 if h[s].get("wrong") or h[s].get("error") else 0
        b = h[s]["busbw_gbs"]
        if s in o and o[s]["busbw_gbs"] > 0:
            cells.append(f"{s >> 10}K {b:.2f}/{o[s]['busbw_gbs']:.2f} ({b / o[s]['busbw_gbs']:.2f}x)")
        else:
            cells.append(f"{s >> 10}K {b:.2f}")
    print(f"G={g}: " + " | ".join(cells))
sys.exit(1 if bad else 0)
PY
  rc=$?
  verdict "halka same-host #wrong" "$rc" "0 in every row" "see shm-vs-gloo.txt"
fi

# --- summary -----------------------------------------------------------------
{
  echo
  echo "total $((SECONDS - T0)) s"
  [[ -s "$LOGS/tcp-stream.txt" ]] && cat "$LOGS/tcp-stream.txt"
  for g in 4 8; do
    if [[ -s "$LOGS/compare-tcp-$g.txt" ]]; then
      echo
      echo "TCP against TCP (halka --shm_links=false), G = $g:"
      sed -n '/^busbw GB\/s, halka/,$p' "$LOGS/compare-tcp-$g.txt"
    fi
  done
  [[ -s "$LOGS/shm-vs-gloo.txt" ]] && { echo; cat "$LOGS/shm-vs-gloo.txt"; }
  [[ -s "$LOGS/seal.txt" ]] && { echo; echo "Sealing, GB/s:"; cat "$LOGS/seal.txt"; }
  [[ -s "$LOGS/tls.txt" ]] && { echo; echo "TLS, G = 4, busbw GB/s:"; cat "$LOGS/tls.txt"; }
} >>"$SUMMARY"
cat "$SUMMARY"
echo "results in $RESULTS (summary.txt, host16.tar.gz)"
exit $FAILED
