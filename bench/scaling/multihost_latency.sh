#!/usr/bin/env bash
# multihost_latency.sh — the all-reduce algorithms on hosts with g workers
# each, joined by links with latency and a rate.
#
# H network namespaces stand for H hosts, each running g workers that
# share its network stack and /dev/shm (same-host links are shared
# memory). The hosts are joined by halka-delaynet (bench/scaling/
# delaynet.cc): a TUN device per namespace, and every packet between two
# hosts goes through the sender's uplink at --rate-mbit, --delay-us of
# one-way latency, and the receiver's downlink at the same rate (this
# kernel has neither netem nor fq, so tc cannot add the latency). The
# rendezvous runs in host 0, with --link_model=probe: the members measure
# α and B of their same-host and cross-host links at formation, and `auto`
# ranks the algorithms by that model (docs/scaling.md).
#
# Two jobs, one after the other:
#   host order  the workers name their host by default (hostname + network
#               namespace): the ring keeps a host's ranks adjacent, and
#               two-level and the tree run on the host groups
#   join order  the control: every worker names a host of its own, so the
#               ring follows the ranks, dealt round-robin (rank r on host
#               r mod H): every ring edge crosses between hosts
# For each job, algorithm and size, every rank runs `halkactl allreduce
# --repeat=N+1` at once against its own worker (float32 sum, every result
# checked: #wrong 0 on every rank, or the cell fails). The first operation
# warms up; for each later one the span is taken as netns_scaling.sh does:
# from the last rank's entry into its worker to the last rank's result
# (end_unix_ms - worker_ms, one clock for every namespace). A cell is the
# median span (min-max), and, for auto, the algorithm it ran and the
# model's prediction.
#
# Usage (as root): bench/scaling/multihost_latency.sh [BUILD_DIR]
#   --hosts H          (default 4)        --per-host g  (default 2)
#   --delay-us D       one-way latency between hosts (default 2000)
#   --rate-mbit R      each host's link rate each way (default 1000; 0: none)
#   --sizes "4K 16K 64K 256K 1M 4M"       (K and M: KiB and MiB)
#   --repeat N         timed operations per cell (default 10)
#   --rounds R         run every job's cells R times over, round by round
#                      (default 1): the table's cell is the median of the
#                      rounds' figures (R = 2: their mean), so that a slow
#                      minute of this machine moves every column alike;
#                      the CSV keeps each round's row
#   --algos "ring two_level tree recursive_doubling halving_doubling auto"
#                      (host order)
#   --join-algos "ring"                   (join order; "" skips that job)
#   --out FILE         also write the table as CSV
#   --worker-args "…"  extra flags for every halka-worker (e.g.
#                      "--chunk_bytes=262144")
#   --mpi              also Open MPI's MPI_Allreduce on the same namespaces
#                      (bench/compare/mpi_bench.cc, built with mpicxx
#                      unless --mpi-bench PATH): its g ranks of a host in
#                      that host's namespace, host by host (the placement
#                      its ring likes best), `--mca btl tcp,self` over tun0
#                      (every rank shares one hostname here, so Open MPI
#                      would take shared memory between hosts otherwise:
#                      its ranks on one host talk TCP over loopback); its
#                      own algorithm choice; the median span per operation,
#                      from the last rank's start to the last rank's end on
#                      the wall clock, as halka's cells (the slowest rank's
#                      time, which compare.sh reports, also holds its wait
#                      for a rank that left the barrier later)
#   --gloo             also Gloo on the same namespaces (bench/compare/
#                      gloo_bench.cc in process mode, built with g++ and
#                      -lgloo unless --gloo-bench PATH): one process per
#                      rank, host by host as for Open MPI, each rank's TCP
#                      device on its host's tun0 address, rendezvous through
#                      a gloo FileStore in the log directory; the median
#                      span per operation, as for Open MPI
#   --gloo-algos "ring_chunked halving_doubling"  which of gloo_bench's
#                      algorithms (also ring, and allreduce: gloo::allreduce,
#                      what torch.distributed's gloo backend calls)
#   --trace-dir DIR    after each cell, every rank's timeline of its last
#                      operations (halkactl trace: Chrome trace JSON) in
#                      DIR/JOB.ALGO.SIZE.ROUND.json
# Exit: 0 every cell ran with 0 wrong, 1 a cell failed, 77 cannot build the
# network here (not root, no netns or /dev/net/tun).
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=tests/system/lib.sh
source "$REPO/tests/system/lib.sh"
# shellcheck source=tests/system/netns.sh
source "$REPO/tests/system/netns.sh"

BUILD_ARG="" H=4 PER=2 DELAY=2000 RATE=1000 REPEAT=10 ROUNDS=1 OUT="" TRACE_DIR=""
MPI=0 MPI_BENCH="" WORKER_ARGS="" GLOO=0 GLOO_BENCH=""
GLOO_ALGOS="ring_chunked halving_doubling"
SIZES="4K 16K 64K 256K 1M 4M"
ALGOS="ring two_level tree recursive_doubling halving_doubling auto"
JOIN_ALGOS="ring"
while (( $# )); do
  case $1 in
    --hosts) H=$2; shift 2 ;;
    --per-host) PER=$2; shift 2 ;;
    --delay-us) DELAY=$2; shift 2 ;;
    --rate-mbit) RATE=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --algos) ALGOS=$2; shift 2 ;;
    --join-algos) JOIN_ALGOS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --trace-dir) TRACE_DIR=$2; shift 2 ;;
    --mpi) MPI=1; shift ;;
    --worker-args) WORKER_ARGS=$2; shift 2 ;;
    --mpi-bench) MPI=1; MPI_BENCH=$2; shift 2 ;;
    --gloo) GLOO=1; shift ;;
    --gloo-bench) GLOO=1; GLOO_BENCH=$2; shift 2 ;;
    --gloo-algos) GLOO=1; GLOO_ALGOS=$2; shift 2 ;;
    -*) echo "FAIL: unknown option $1"; exit 1 ;;
    *) BUILD_ARG=$1; shift ;;
  esac
done
for v in "$H" "$PER" "$REPEAT" "$ROUNDS"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "FAIL: --hosts/--per-host/--repeat/--rounds take a whole number >= 1"; exit 1; }
done
[[ $DELAY =~ ^[0-9]+$ && $RATE =~ ^[0-9]+$ ]] || { echo "FAIL: --delay-us and --rate-mbit take whole numbers"; exit 1; }
(( H >= 2 && H <= 16 && PER <= 8 )) || { echo "FAIL: --hosts 2..16, --per-host 1..8"; exit 1; }
sys_binaries "$BUILD_ARG"
DELAYNET=$BUILD/bench/scaling/halka-delaynet
[[ -x $DELAYNET ]] || { echo "FAIL: missing $DELAYNET"; exit 1; }
(( EUID == 0 )) || { echo "SKIP: needs root (ip netns, /dev/net/tun)"; exit 77; }
[[ -c /dev/net/tun ]] || { echo "SKIP: no /dev/net/tun"; exit 77; }

G=$(( H * PER ))
P="ml$$-"
NET=198.18.42
addr_host() { echo "$NET.$(( 10 + $1 ))"; }
host_of() { echo $(( $1 % H )); }
port_of() { echo $(( 7200 + $1 / H )); }
RDV_ADDR="$(addr_host 0):7100"
elements() {  # elements SIZE: float32 count of 4K, 1M, ...
  local s=$1 n
  case $s in
    *K) n=$(( ${s%K} * 1024 )) ;;
    *M) n=$(( ${s%M} * 1048576 )) ;;
    *) n=$s ;;
  esac
  echo $(( n / 4 ))
}

# ------------------------------------------------------------ network

sys_init
trap netns_cleanup EXIT
trap 'SYS_FAILED=1; echo "interrupted" >&2; netns_cleanup' INT TERM
pairs=()
for (( h = 0; h < H; ++h )); do
  ip netns add "${P}h$h" || { echo "SKIP: cannot make a network namespace"; exit 77; }
  NETNS_MADE+=("${P}h$h")
  ip -n "${P}h$h" link set lo up
  pairs+=("${P}h$h=$(addr_host $h)")
done
start_daemon delaynet "$DELAYNET" --delay_us="$DELAY" --rate_mbit="$RATE" "${pairs[@]}"
wait_for_line delaynet "^halka-delaynet ready" 10
for (( h = 0; h < H; ++h )); do
  # Jumbo frames: a datacenter's MTU, and a sixth of the packets through
  # the one forwarding thread that 1500 would take.
  if ! ip -n "${P}h$h" addr add "$(addr_host $h)/24" dev tun0 ||
     ! ip -n "${P}h$h" link set tun0 up mtu 9000; then
    fail "cannot configure tun0 in ${P}h$h"
  fi
done
log "$H hosts x $PER workers (G=$G), $DELAY us one way between hosts, ${RATE} Mbit/s per host each way; logs in $SYS_LOG"

start_daemon rdv ip netns exec "${P}h0" "$RDV_BIN" --listen="$RDV_ADDR" \
  --heartbeat_interval=500ms --heartbeat_timeout=10s --link_model=probe
wait_for_line rdv "^halka-rendezvous listening on " 15

# ------------------------------------------------------------ jobs

ROWS=()   # "round job algo size median min max ran model_ms"
ROUND=1
# start_job TAG MODE: G workers (rank r on host r mod H); MODE default or own.
# The job and its workers are named by round too (DTAG: host1, join2), so
# that each round's are new processes with logs of their own.
start_job() {
  local tag=$1 mode=$2 r
  DTAG="$1$ROUND"
  JOB="ml-$DTAG-$$"
  # shellcheck disable=SC2086  # WORKER_ARGS: several flags
  netns_start_workers "$DTAG" "$mode" "$JOB" $WORKER_ARGS
  for (( r = 0; r < G; ++r )); do
    wait_for_line "$DTAG.w$r" "^halka-worker serving on " 60
    wait_for_line "$DTAG.w$r" "joined job $JOB: rank $r of $G" 30 "$SYS_LOG/$DTAG.w$r.err"
  done
  HEALTH=$(ip netns exec "${P}h0" timeout --foreground -s KILL 15 "$CTL_BIN" health \
             --rendezvous="$RDV_ADDR" --job="$JOB" 2>&1)
  log "$tag: $(head -n 1 <<<"$HEALTH")"
  grep -E "link model" <<<"$HEALTH" | head -n 1 | sed 's/^/    /'
}
stop_job() {
  local r
  for (( r = 0; r < G; ++r )); do
    pid_alive "${SYS_PID[$DTAG.w$r]}" ||
      fail "$DTAG.w$r exited before its job was stopped: $(tail -n 3 "$SYS_LOG/$DTAG.w$r.err")"
    stop_timed "$DTAG.w$r" TERM 15
    [[ -n $STOP_MS ]] || fail "$DTAG.w$r did not stop within 15 s of TERM"
  done
}

# cell TAG ALGO SIZE: every rank, REPEAT+1 checked all-reduces; one row.
cell() {
  local tag=$1 algo=$2 size=$3 r h names=() count name files=() limit
  count=$(elements "$size")
  # Each rank's halkactl makes its buffer and the result it must get (from
  # every rank's data) and checks every operation's, on these 2 shared
  # cores: allow G/2 s per operation and MiB of float32 elements on top.
  limit=$(( 120 + count / 1048576 * (REPEAT + 1) * G / 2 ))
  name="$tag.$algo.$size.$ROUND"
  for (( r = 0; r < G; ++r )); do
    h=$(host_of $r)
    run_bg "$name.r$r" ip netns exec "${P}h$h" timeout --foreground -s KILL "$limit" \
      "$CTL_BIN" allreduce --worker="$(addr_host "$h"):$(port_of "$r")" --algo="$algo" \
      --count="$count" --dtype=float32 --op=sum --repeat=$(( REPEAT + 1 )) \
      --timeout=60s --transfer=shm --check=true
    names+=("$name.r$r")
    files+=("$SYS_LOG/$name.r$r.out")
  done
  wait_bg $(( limit + 20 )) "${names[@]}"
  for (( r = 0; r < G; ++r )); do
    [[ "$(bg_rc "$name.r$r")" == 0 ]] ||
      fail "$name: rank $r exited $(bg_rc "$name.r$r"): $(tail -n 5 "$SYS_LOG/$name.r$r.err" "$SYS_LOG/$name.r$r.out")"
    assert_eq "$(grep -cE "^rank $r/$G: all_reduce #[0-9]+ .*#wrong 0\$" "$SYS_LOG/$name.r$r.out")" \
      "$(( REPEAT + 1 ))" "$name: rank $r's all-reduces with #wrong 0"
  done
  local row
  row=$(python3 - "${files[@]}" <<'PY'
import re, statistics, sys
line = re.compile(r"algo=(\S+) .* in [0-9.]+ ms \(worker_ms=([0-9.]+)(?: model_ms=([0-9.]+))? end_unix_ms=([0-9.]+)\)")
ranks = []
for path in sys.argv[1:]:
    ops = [line.search(l) for l in open(path)]
    ranks.append([m for m in ops if m])
n = min(len(r) for r in ranks)
spans, algos, models = [], set(), []
for k in range(1, n):  # the first operation warms up
    ends = [float(r[k].group(4)) for r in ranks]
    starts = [float(r[k].group(4)) - float(r[k].group(2)) for r in ranks]
    spans.append(max(ends) - max(starts))
    algos.update(r[k].group(1) for r in ranks)
    models += [float(r[k].group(3)) for r in ranks if r[k].group(3)]
model = "%.3f" % statistics.median(models) if models else "-"
print("%.3f %.3f %.3f %s %s" % (statistics.median(spans), min(spans), max(spans),
                                "/".join(sorted(algos)), model))
PY
) || fail "$name: cannot read the ranks' lines"
  # Every all-reduce on two or more hosts crosses between hosts at least
  # once: a span under half the one-way delay means the latency was not
  # there (half: the span's start is each rank's result time less its
  # worker's time, which also holds the rank's way back to its caller).
  awk -v m="${row%% *}" -v d="$DELAY" 'BEGIN { exit !(m * 2000 >= d) }' ||
    fail "$name: median span ${row%% *} ms is under half the one-way delay ($DELAY us): the hosts' traffic did not go through halka-delaynet"
  ROWS+=("$ROUND $tag $algo $size $row")
  if [[ -n $TRACE_DIR ]]; then
    mkdir -p "$TRACE_DIR"
    ip netns exec "${P}h0" timeout --foreground -s KILL 30 "$CTL_BIN" trace \
      --rendezvous="$RDV_ADDR" --job="$JOB" -o "$TRACE_DIR/$name.json" \
      >/dev/null 2>&1 || log "$name: halkactl trace failed"
  fi
  log "$tag $algo $size: median span, min, max (ms), ran, model (ms): $row"
}

halka_jobs() {
if [[ -n $ALGOS ]]; then
  start_job host default
  for a in $ALGOS; do for s in $SIZES; do cell host "$a" "$s"; done; done
  stop_job
fi
if [[ -n $JOIN_ALGOS ]]; then
  start_job join own
  for a in $JOIN_ALGOS; do for s in $SIZES; do cell join "$a" "$s"; done; done
  stop_job
fi
}

# peer_limit SIZE: seconds for Open MPI's or Gloo's REPEAT + 2 operations
# of SIZE (their buffers are one rank's: 1 s per operation and MiB).
peer_limit() {
  echo $(( 300 + $(elements "$1") / 262144 * (REPEAT + 2) ))
}

# peer_row FILE LABEL: a cell's row ("median min max LABEL -", ms) from
# mpi_bench's or gloo_bench's one JSON line of a size (its spans); fails
# unless there is exactly one, with 0 wrong and no error.
peer_row() {
  python3 - "$1" "$2" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
if len(rows) != 1 or rows[0]["wrong"] != 0 or rows[0]["error"]:
    sys.exit("want one row with 0 wrong: %s" % rows)
r = rows[0]
print("%.3f %.3f %.3f %s -" % (r["span_median_us"] / 1e3, r["span_min_us"] / 1e3,
                               r["span_max_us"] / 1e3, sys.argv[2]))
PY
}

mpi_cells() {
  local size ctx h row
  MPIRUN=$(command -v mpirun) || fail "--mpi: no mpirun (apt-get install openmpi-bin libopenmpi-dev)"
  if [[ -z $MPI_BENCH ]]; then
    command -v mpicxx >/dev/null || fail "--mpi: no mpicxx to build mpi_bench (or pass --mpi-bench PATH)"
    mpicxx -O2 -std=c++20 "$REPO/bench/compare/mpi_bench.cc" -o "$SYS_LOG/mpi_bench" ||
      fail "--mpi: cannot build bench/compare/mpi_bench.cc"
    MPI_BENCH=$SYS_LOG/mpi_bench
  fi
  for size in $SIZES; do
    ctx=()
    for (( h = 0; h < H; ++h )); do
      (( h > 0 )) && ctx+=(":")
      ctx+=(-np "$PER" ip netns exec "${P}h$h" "$MPI_BENCH" --world="$G"
            --min="$size" --max="$size" --iters="$REPEAT" --warmup=2 --label=tcp)
    done
    # mpirun in host 0; its PMIx server takes its ranks' connections on
    # tun0 (the others' namespaces cannot reach its loopback).
    run_bg "mpi.$size.$ROUND" ip netns exec "${P}h0" env PMIX_MCA_ptl_tcp_remote_connections=1 \
      PMIX_MCA_ptl_tcp_if_include=tun0 OMPI_MCA_oob_tcp_if_include=tun0 \
      timeout --foreground -k 10 "$(peer_limit "$size")" "$MPIRUN" --allow-run-as-root \
      --oversubscribe --bind-to none --mca pml ob1 --mca btl tcp,self \
      --mca btl_tcp_if_include tun0 "${ctx[@]}"
    wait_bg $(( $(peer_limit "$size") + 20 )) "mpi.$size.$ROUND"
    [[ "$(bg_rc "mpi.$size.$ROUND")" == 0 ]] ||
      fail "mpi $size: mpirun exited $(bg_rc "mpi.$size.$ROUND"): $(tail -n 5 "$SYS_LOG/mpi.$size.$ROUND.err")"
    row=$(peer_row "$SYS_LOG/mpi.$size.$ROUND.out" MPI_Allreduce) ||
      fail "mpi $size: $(cat "$SYS_LOG/mpi.$size.$ROUND.out")"
    ROWS+=("$ROUND mpi tcp $size $row")
    log "mpi tcp $size: median span (ms): ${row%% *}"
  done
}

gloo_cells() {
  local algo size name names store r h row
  if [[ -z $GLOO_BENCH ]]; then
    command -v g++ >/dev/null || fail "--gloo: no g++ to build gloo_bench (or pass --gloo-bench PATH)"
    g++ -O2 -std=c++20 -pthread "$REPO/bench/compare/gloo_bench.cc" -o "$SYS_LOG/gloo_bench" -lgloo ||
      fail "--gloo: cannot build bench/compare/gloo_bench.cc (apt-get install libgloo-dev)"
    GLOO_BENCH=$SYS_LOG/gloo_bench
  fi
  for algo in $GLOO_ALGOS; do
    for size in $SIZES; do
      name="gloo.$algo.$size.$ROUND" names=()
      store="$SYS_LOG/$name.store"
      rm -rf "$store"; mkdir -p "$store" || fail "$name: cannot make $store"
      for (( r = 0; r < G; ++r )); do
        h=$(( r / PER ))  # host by host, as Open MPI's ranks
        run_bg "$name.r$r" ip netns exec "${P}h$h" timeout --foreground -k 10 "$(peer_limit "$size")" \
          "$GLOO_BENCH" --world="$G" --rank="$r" --store="$store" --addr="$(addr_host "$h")" \
          --min="$size" --max="$size" --iters="$REPEAT" --warmup=2 --algo="$algo"
        names+=("$name.r$r")
      done
      wait_bg $(( $(peer_limit "$size") + 20 )) "${names[@]}"
      for (( r = 0; r < G; ++r )); do
        [[ "$(bg_rc "$name.r$r")" == 0 ]] ||
          fail "$name: rank $r exited $(bg_rc "$name.r$r"): $(tail -n 5 "$SYS_LOG/$name.r$r.err")"
      done
      row=$(peer_row "$SYS_LOG/$name.r0.out" "gloo-$algo") ||
        fail "$name: $(cat "$SYS_LOG/$name.r0.out")"
      ROWS+=("$ROUND gloo $algo $size $row")
      log "gloo $algo $size: median, min, max span (ms): ${row% * *}"
    done
  done
}

for (( ROUND = 1; ROUND <= ROUNDS; ++ROUND )); do
  (( ROUNDS > 1 )) && log "round $ROUND of $ROUNDS"
  halka_jobs
  (( MPI )) && mpi_cells
  (( GLOO )) && gloo_cells
done

# ------------------------------------------------------------ table

{
  echo "round,job,algo,size,median_ms,min_ms,max_ms,ran,model_ms"
  for r in "${ROWS[@]}"; do tr ' ' ',' <<<"$r"; done
} >"$SYS_LOG/cells.csv"
[[ -n $OUT ]] && cp "$SYS_LOG/cells.csv" "$OUT"
python3 - "$SYS_LOG/cells.csv" "$H" "$PER" "$DELAY" "$RATE" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
h, g, delay, rate = sys.argv[2:6]
cols = [(r["job"], r["algo"]) for r in rows]
cols = list(dict.fromkeys(cols))
sizes = list(dict.fromkeys(r["size"] for r in rows))
rounds = len(set(r["round"] for r in rows))
# A cell over the rounds: the median of their figures, what auto ran in
# any of them.
cell = {}
for r in rows:
    cell.setdefault((r["job"], r["algo"], r["size"]), []).append(r)
for k, rs in cell.items():
    ran = sorted(set(x for r in rs for x in r["ran"].split("/")))
    cell[k] = {"median_ms": "%.3f" % statistics.median(float(r["median_ms"]) for r in rs),
               "ran": "/".join(ran)}
name = lambda c: {"join": "join-order " + c[1], "mpi": "Open MPI tcp",
                  "gloo": "Gloo " + c[1]}.get(c[0], c[1])
print(f"\n{h} hosts x {g} workers, {delay} us one way, {rate} Mbit/s: median ms per all-reduce (float32 sum)"
      + (f", median of {rounds} rounds" if rounds > 1 else ""))
print("| size | " + " | ".join(name(c) for c in cols) + " | auto ran | flat ring / best two-level |")
print("|---|" + "---:|" * len(cols) + "---|---:|")
for s in sizes:
    vals = [cell.get((c[0], c[1], s)) for c in cols]
    out = [v["median_ms"] if v else "-" for v in vals]
    auto = cell.get(("host", "auto", s))
    flat = [float(cell[(j, "ring", s)]["median_ms"]) for j in ("host", "join") if (j, "ring", s) in cell]
    two = [float(cell[("host", a, s)]["median_ms"]) for a in ("two_level", "tree") if ("host", a, s) in cell]
    ratio = "%.2fx" % (min(flat) / min(two)) if flat and two else "-"
    print(f"| {s} | " + " | ".join(out) + f" | {auto['ran'] if auto else '-'} | {ratio} |")
PY
echo "PASS: every cell ran with 0 wrong on every rank"
