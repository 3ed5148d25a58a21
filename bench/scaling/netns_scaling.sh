#!/usr/bin/env bash
# netns_scaling.sh — halka all-reduce scaling on real, shaped links.
#
# Builds one Linux bridge (in a "switch" namespace of its own) and, on it,
# one network namespace per host: G workers (198.18.0.10+i/24), the
# rendezvous (198.18.0.2) and, for PS mode, a dedicated parameter server
# (198.18.0.3). Every host's link is capped in BOTH directions with tc tbf:
# egress of the namespace side of its veth (what the host sends) and egress
# of the bridge side (what the host receives).
# For each world size G it starts G workers (and halka-ps), then for each
# algorithm and buffer size runs `halkactl allreduce` on every rank at once,
# checks every result (#wrong 0 on every rank) and times every operation two
# ways: the span, from the last rank's entry into its worker to the last
# rank's result (halkactl's end_unix_ms - worker_ms, one clock for all
# namespaces), and the slowest rank's worker time (max over ranks of
# worker_ms, which adds how long that rank waited for the others to post);
# each as the median over repeats, with min and max. Every row also records
# the daemons' CPU-seconds per operation, how busy the machine's CPUs were
# and the 1-min load: on a small shared machine those set the times.
#
# Theory, S = buffer bytes, R = link rate in bytes/s:
#   ring   2(G-1)/G · S/R   (every link carries 2(G-1)/G · S each way)
#   ps     G · S/R          (the server's link carries G·S in and G·S out)
#   naive  (G-1) · S/R      (every worker sends (G-1)·S)
# tbf counts Ethernet frames, so TCP/IP/gRPC framing alone puts the best
# possible ratio (measured/theory) near 1.05.
#
# Needs root (ip netns, veth, bridge, tc). Traffic stays inside the bridge
# (198.18.0.0/24, RFC 2544 benchmark space); nothing is added to the root
# namespace, so its firewall (Docker's FORWARD DROP via br_netfilter) cannot
# interfere. Every namespace is named with a per-run prefix "hs<pid>-" and
# removed on exit, on INT and on TERM. Every wait is bounded.
#
# Usage: bench/scaling/netns_scaling.sh [options]
#   --build DIR        build directory with server/ worker/ client/ (default:
#                      <repo>/build)
#   --sizes-mib "64"   buffer sizes in MiB (float32, count = MiB·262144)
#   --worlds "2 3 4 6 8"
#   --algos "ring ps naive"   (ps is skipped when server/halka-ps is missing)
#   --rate 1gbit       link rate (tc syntax: bit kbit mbit gbit, or bps kbps
#                      mbps gbps for bytes/s)
#   --burst BYTES      tbf burst (default: 2 ms at the rate, at least 64 KiB)
#   --latency 20ms     tbf latency (queue bound)
#   --mtu 1500         MTU of every link (9000: jumbo frames; tbf counts
#                      whole Ethernet frames, so framing is 4.7 % of the
#                      wire at 1500 and 0.7 % at 9000: the bound S/R counts
#                      payload only)
#   --repeats 3        timed operations per (size, G, algo)
#   --op-timeout 120   seconds: deadline of one operation
#   --max-seconds 3600 overall bound; every daemon is also wrapped in timeout
#   --out DIR          results (default: ./netns-scaling-YYYYmmdd-HHMMSS)
#   --plot auto|yes|no PNG with gnuplot (yes: apt-get install gnuplot-nox
#                      when missing; auto (default): same as yes when root
#                      and apt-get exist, otherwise skip the plot)
#   --keep-logs        keep every process's logs in OUT/logs even on success
#   --warmup full|1    untimed operation(s) before the timed ones, per
#                      (G, algo): "full" (default) = one at the timed size
#                      (the first 64 MiB operation on fresh links and
#                      buffers is 1.3-4x slower than the next ones), "1" =
#                      one of 1 MiB (the old behaviour: opens links only)
#   --worker-args "..." extra flags for every halka-worker (e.g.
#                      "--chunk_bytes=262144"); --ps-args for halka-ps
#
# Outputs in OUT: results.csv (one row per size, G, algo), ops.csv (one row
# per rank and operation), scaling_<size>MiB.png, logs/ (on failure, or
# with --keep-logs; a process still running 5 s after SIGTERM gets every
# thread's stack dumped there with gdb, when gdb is installed).
# Exit status: 0 when every row is OK, 1 when any row FAILED, 2 on a usage
# or setup error, 130/143 when interrupted.

set -u
set -o pipefail
# Plaintext on namespace addresses (not loopback) needs an explicit
# --insecure (common/security.h); every daemon reads HALKA_INSECURE.
export HALKA_INSECURE=1

# ------------------------------------------------------------------ options
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD="$REPO/build"
SIZES_MIB="64"
WORLDS="2 3 4 6 8"
ALGOS="ring ps naive"
RATE="1gbit"
BURST=""
LATENCY="20ms"
MTU=1500
REPEATS=3
OP_TIMEOUT=120
MAX_SECONDS=3600
OUT=""
PLOT="auto"
KEEP_LOGS=0
WORKER_ARGS=""
PS_ARGS=""
WARMUP=full

usage() { sed -n '2,/^$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
die() { echo "netns_scaling: $*" >&2; exit 2; }

ORIG_ARGS=("$@")
while (( $# > 0 )); do
  arg=$1; val=""
  case "$arg" in
    --*=*) val=${arg#*=}; arg=${arg%%=*} ;;
    --help|-h|--keep-logs) ;;
    --*) (( $# >= 2 )) || die "$arg needs a value"; val=$2; shift ;;
  esac
  case "$arg" in
    --build) BUILD=$val ;;
    --sizes-mib) SIZES_MIB=$val ;;
    --worlds) WORLDS=$val ;;
    --algos) ALGOS=$val ;;
    --rate) RATE=$val ;;
    --burst) BURST=$val ;;
    --latency) LATENCY=$val ;;
    --mtu) MTU=$val ;;
    --repeats) REPEATS=$val ;;
    --op-timeout) OP_TIMEOUT=$val ;;
    --max-seconds) MAX_SECONDS=$val ;;
    --out) OUT=$val ;;
    --plot) PLOT=$val ;;
    --keep-logs) KEEP_LOGS=1 ;;
    --worker-args) WORKER_ARGS=$val ;;
    --warmup) WARMUP=$val ;;
    --ps-args) PS_ARGS=$val ;;
    --help|-h) usage; exit 0 ;;
    *) die "unknown option $arg (see --help)" ;;
  esac
  shift
done

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
is_uint "$REPEATS" && (( REPEATS >= 1 && REPEATS <= 100 )) || die "--repeats: 1..100"
is_uint "$OP_TIMEOUT" && (( OP_TIMEOUT >= 1 )) || die "--op-timeout: seconds"
is_uint "$MAX_SECONDS" && (( MAX_SECONDS >= 10 )) || die "--max-seconds: >= 10"
for g in $WORLDS; do
  is_uint "$g" && (( g >= 2 && g <= 200 )) || die "--worlds: each 2..200, got '$g'"
done
for s in $SIZES_MIB; do
  is_uint "$s" && (( s >= 1 && s <= 4096 )) || die "--sizes-mib: each 1..4096, got '$s'"
done
for a in $ALGOS; do
  case "$a" in ring|naive|ps) ;; *) die "--algos: ring, naive, ps; got '$a'" ;; esac
done
case "$PLOT" in auto|yes|no) ;; *) die "--plot: auto, yes or no" ;; esac
case "$WARMUP" in full|1) ;; *) die "--warmup: full or 1" ;; esac
is_uint "$MTU" && (( MTU >= 576 && MTU <= 65535 )) || die "--mtu: 576..65535"
WORLDS=$(echo $WORLDS); SIZES_MIB=$(echo $SIZES_MIB); ALGOS=$(echo $ALGOS)
[[ -n "$WORLDS" && -n "$SIZES_MIB" && -n "$ALGOS" ]] || die "empty --worlds/--sizes-mib/--algos"

# rate -> bytes/s (tc units: bit=bits/s, bps=bytes/s; k/m/g/t are 10^3..)
RATE_BPS=$(awk -v r="$RATE" 'BEGIN {
  r = tolower(r)
  if (!match(r, /^[0-9]+(\.[0-9]+)?/)) { print ""; exit }
  n = substr(r, 1, RLENGTH) + 0; u = substr(r, RLENGTH + 1)
  m["bit"]=1/8; m["kbit"]=1e3/8; m["mbit"]=1e6/8; m["gbit"]=1e9/8; m["tbit"]=1e12/8
  m["bps"]=1; m["kbps"]=1e3; m["mbps"]=1e6; m["gbps"]=1e9; m["tbps"]=1e12
  if (!(u in m)) { print ""; exit }
  printf "%.0f", n * m[u] }')
[[ -n "$RATE_BPS" && "$RATE_BPS" != 0 ]] || die "--rate: cannot parse '$RATE' (e.g. 1gbit, 500mbit)"
if [[ -z "$BURST" ]]; then
  BURST=$(awk -v b="$RATE_BPS" 'BEGIN { x = b * 0.002; if (x < 65536) x = 65536; printf "%.0f", x }')
fi

RDV_BIN="$BUILD/server/halka-rendezvous"
WORKER_BIN="$BUILD/worker/halka-worker"
CTL_BIN="$BUILD/client/halkactl"
PS_BIN="$BUILD/server/halka-ps"
for b in "$RDV_BIN" "$WORKER_BIN" "$CTL_BIN"; do
  [[ -x "$b" ]] || die "missing binary $b (build it: ninja -C $BUILD $(basename "$b"))"
done
HAVE_PS=0; [[ -x "$PS_BIN" ]] && HAVE_PS=1

(( EUID == 0 )) || die "needs root (ip netns, veth, bridge, tc)"
for t in ip tc timeout setsid awk sort; do
  command -v "$t" >/dev/null 2>&1 || die "needs '$t'"
done

[[ -n "$OUT" ]] || OUT="$PWD/netns-scaling-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$OUT" || die "cannot create $OUT"
OUT=$(cd "$OUT" && pwd)
LOGS="$OUT/logs"
rm -rf -- "$LOGS"; mkdir -p "$LOGS"

# ------------------------------------------------------------------ state
# Per-run prefix: "hs<pid>-" (≤ 10 chars, so every interface name ≤ 15).
P="hs$$-"
SW="${P}sw"        # the switch namespace (holds the bridge br0)
RUN_START=$(date +%s)
DEADLINE=$(( RUN_START + MAX_SECONDS ))
# netns_add_host (the same hosts the system tests build); it sets
# NETNS_MADE=(), the namespaces created by this run.
# shellcheck source=tests/system/netns.sh
source "$HERE/../../tests/system/netns.sh"
LINKS_MADE=()      # root-namespace links (none today; kept for cleanup)
declare -A PID_OF=()   # name -> pid of a process group leader we started
PROC_NAMES=()
ANY_FAILED=0

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*"; }
left_s() { echo $(( DEADLINE - $(date +%s) )); }

pid_alive() {
  local st
  st=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n "$st" && "$st" != Z && "$st" != X ]]
}

# dump_stacks NAME PID : when gdb is there, every thread's backtrace of the
# processes under PID (a hang on shutdown is a bug worth a stack) goes to
# $LOGS/NAME.stacks. Bounded.
dump_stacks() {
  local name=$1 pid=$2 kids k
  command -v gdb >/dev/null 2>&1 || return 0
  kids=$(cat /proc/"$pid"/task/*/children 2>/dev/null)
  for k in $kids; do
    timeout 30 gdb -p "$k" -batch -ex "thread apply all bt" \
      >>"$LOGS/$name.stacks" 2>&1 </dev/null
  done
  echo "netns_scaling: stacks of $name in $LOGS/$name.stacks" >&2
}

# stop_procs NAME... : SIGTERM each one's process group, SIGKILL what is
# still there after 5 s; bounded.
stop_procs() {
  local name pid i any left=()
  for name in "$@"; do
    pid=${PID_OF[$name]:-}
    [[ -n "$pid" ]] || continue
    if pid_alive "$pid"; then
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    fi
    left+=("$name")
  done
  # (`timeout -k 10` around each process would SIGKILL it after 10 s too.)
  local t0 ms; t0=$(date +%s%N)
  declare -A gone_ms=()
  for i in $(seq 1 250); do
    any=0
    for name in "${left[@]}"; do
      if pid_alive "${PID_OF[$name]}"; then
        any=1
      elif [[ -z "${gone_ms[$name]:-}" ]]; then
        gone_ms[$name]=$(( ($(date +%s%N) - t0) / 1000000 ))
      fi
    done
    (( any )) || break
    sleep 0.02
  done
  for name in "${left[@]}"; do
    pid=${PID_OF[$name]}
    if pid_alive "$pid"; then
      echo "netns_scaling: $name (pid $pid) still running 5 s after SIGTERM; SIGKILL" >&2
      dump_stacks "$name" "$pid"
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
    elif (( ${gone_ms[$name]:-0} > 2000 )); then
      echo "netns_scaling: $name took ${gone_ms[$name]} ms to exit after SIGTERM" >&2
    fi
    kill -KILL -- "-$pid" 2>/dev/null   # leftovers of its group, if any
    wait "$pid" 2>/dev/null
    unset "PID_OF[$name]"
  done
  return 0
}

CLEANED=0
cleanup() {
  local rc=$?
  (( CLEANED )) && return
  CLEANED=1
  trap - EXIT INT TERM
  local name ns pids l i
  stop_procs "${PROC_NAMES[@]}"
  # Anything still inside our namespaces is ours: end it by PID.
  for ns in "${NETNS_MADE[@]}"; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [[ -n "$pids" ]] && kill -KILL $pids 2>/dev/null
  done
  for ns in "${NETNS_MADE[@]}"; do
    for i in 1 2 3 4 5; do
      ip netns del "$ns" 2>/dev/null && break
      ip netns list 2>/dev/null | grep -qw -- "$ns" || break
      sleep 0.2
    done
  done
  for l in "${LINKS_MADE[@]}"; do
    ip link show dev "$l" >/dev/null 2>&1 && ip link del dev "$l" 2>/dev/null
  done
  local leftover=""
  for ns in "${NETNS_MADE[@]}"; do
    ip netns list 2>/dev/null | grep -qw -- "$ns" && leftover+=" netns:$ns"
  done
  for l in "${LINKS_MADE[@]}"; do
    ip link show dev "$l" >/dev/null 2>&1 && leftover+=" link:$l"
  done
  [[ -n "$leftover" ]] && echo "netns_scaling: could not remove:$leftover" >&2
  if (( rc == 0 && ANY_FAILED == 0 && KEEP_LOGS == 0 )); then
    rm -rf -- "$LOGS"
  else
    echo "netns_scaling: logs in $LOGS" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "netns_scaling: interrupted" >&2; exit 130' INT
trap 'echo "netns_scaling: terminated" >&2; exit 143' TERM

# start_in NS NAME CMD... : start CMD inside namespace NS, in its own process
# group, bounded by what is left of --max-seconds. stdout/stderr go to
# $LOGS/NAME.out/.err. The recorded pid is `timeout`'s (it forwards TERM).
start_in() {
  local ns=$1 name=$2; shift 2
  local bound; bound=$(left_s); (( bound > 5 )) || bound=5
  setsid ip netns exec "$ns" timeout -k 10 "$bound" "$@" \
    >"$LOGS/$name.out" 2>"$LOGS/$name.err" </dev/null &
  PID_OF[$name]=$!
  PROC_NAMES+=("$name")
}

# wait_until NAME TIMEOUT_S WHAT CMD... : until CMD succeeds (polled every
# 50 ms); returns 1 on timeout, or when NAME died first (its last log lines
# go to stderr, and a CMD that holds by then still counts).
wait_until() {
  local name=$1 t=$2 what=$3 i; shift 3
  for (( i = 0; i < t * 20; i++ )); do
    "$@" && return 0
    if ! pid_alive "${PID_OF[$name]}"; then
      "$@" && return 0
      echo "netns_scaling: $name exited before $what:" >&2
      tail -n 15 "$LOGS/$name.err" "$LOGS/$name.out" >&2 2>/dev/null
      return 1
    fi
    sleep 0.05
  done
  echo "netns_scaling: $name: not $what within ${t}s" >&2
  tail -n 15 "$LOGS/$name.err" >&2 2>/dev/null
  return 1
}

# wait_line NAME FILE ERE TIMEOUT_S : until FILE has a line matching ERE.
has_line() { grep -qE -- "$1" "$2" 2>/dev/null; }
wait_line() {
  wait_until "$1" "$4" "/$3/" has_line "$3" "$2"
}

# wait_listen NS NAME PORT TIMEOUT_S : until something listens on PORT in NS.
listening() { ip netns exec "$1" ss -Hltn "sport = :$2" 2>/dev/null | grep -q .; }
wait_listen() {
  wait_until "$2" "$4" "listening on :$3" listening "$1" "$3"
}

# ------------------------------------------------------------------ network
ADDR_RDV=198.18.0.2
ADDR_PS=198.18.0.3
addr_worker() { echo "198.18.0.$(( 10 + $1 ))"; }

shape() {  # shape DEV [NS] : tbf on egress of DEV (inside NS when given)
  local dev=$1 ns=${2:-}
  local cmd=(tc qdisc replace dev "$dev" root tbf rate "$RATE" burst "$BURST" latency "$LATENCY")
  if [[ -n "$ns" ]]; then ip netns exec "$ns" "${cmd[@]}"; else "${cmd[@]}"; fi
}

# add_host SHORT ADDR : namespace ${P}SHORT with eth0=ADDR/24, whose peer
# (port hSHORT) is on the bridge in the switch namespace; shaped both ways.
# The pair is created in place, so no link ever exists in the root namespace.
add_host() {
  netns_add_host "$1" "$2" || return 1   # tests/system/netns.sh
  if (( MTU != 1500 )); then
    ip -n "${P}$1" link set eth0 mtu "$MTU" || return 1
    ip -n "$SW" link set "h$1" mtu "$MTU" || return 1
  fi
  shape eth0 "${P}$1" || return 1        # what the host sends
  shape "h$1" "$SW" || return 1          # what the host receives
}

# Does one host reach another? (bash /dev/tcp, bounded)
can_reach() {  # can_reach NS ADDR PORT
  ip netns exec "$1" timeout 3 bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null
}

MAXG=0
for g in $WORLDS; do (( g > MAXG )) && MAXG=$g; done
WANT_PS=0
for a in $ALGOS; do [[ $a == ps ]] && WANT_PS=1; done

log "run prefix $P; output $OUT"
{
  echo "command: ${BASH_SOURCE[0]} ${ORIG_ARGS[*]}"
  echo "start: $(date -u +%FT%TZ); $(uptime)"
  echo "cpus: $(nproc); kernel: $(uname -r); tcp_congestion_control (netns default): $(sysctl -n net.ipv4.tcp_congestion_control 2>/dev/null)"
} >"$OUT/run.txt"
(( WANT_PS && ! HAVE_PS )) && echo "ps: skipped (halka-ps not built)"
log "link: tbf rate $RATE ($RATE_BPS B/s) burst $BURST latency $LATENCY, mtu $MTU, both directions"
# The bridge lives in its own "switch" namespace: the root namespace's
# firewall (e.g. Docker's FORWARD policy DROP, applied to bridged frames by
# br_netfilter) never sees this traffic, and nothing is added to the root
# namespace at all.
netns_make_switch || die "cannot create namespace $SW with bridge br0"
add_host r "$ADDR_RDV" || die "cannot build host ${P}r"
if (( WANT_PS && HAVE_PS )); then
  add_host p "$ADDR_PS" || die "cannot build host ${P}p"
fi
for (( i = 0; i < MAXG; i++ )); do
  add_host "w$i" "$(addr_worker "$i")" || die "cannot build host ${P}w$i"
done
log "built $(( ${#NETNS_MADE[@]} - 1 )) hosts on bridge br0 in namespace $SW; shaping of ${P}w0:"
{
  echo "  # namespace side (${P}w0 eth0, what w0 sends):"
  ip netns exec "${P}w0" tc qdisc show dev eth0 | sed 's/^/  /'
  echo "  # bridge side (port hw0 in $SW, what w0 receives):"
  ip netns exec "$SW" tc qdisc show dev hw0 | sed 's/^/  /'
} | tee "$OUT/tc_qdisc_w0.txt"

# ------------------------------------------------------------------ rendezvous
RDV_PORT=7100
start_in "${P}r" rdv "$RDV_BIN" --listen="$ADDR_RDV:$RDV_PORT" \
  --heartbeat_interval=1s --heartbeat_timeout=10s
wait_line rdv "$LOGS/rdv.out" "listening on" 20 || die "rendezvous did not start"
can_reach "${P}w0" "$ADDR_RDV" "$RDV_PORT" ||
  die "w0 cannot reach the rendezvous at $ADDR_RDV:$RDV_PORT over the bridge"

# ------------------------------------------------------------------ runs
# cpu_ticks: "total idle" jiffies of the whole machine (idle + iowait), to
# give every row the share of the machine's CPUs that was busy while its
# operations ran (all processes, ours and everyone else's).
cpu_ticks() {
  awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t, $5 + $6; exit }' /proc/stat
}
ROW_CPU=""; ROW_LOAD=""; ROW_DCPU=""
# daemon_cpu_s: CPU seconds (user + system) used so far by every halka-worker
# and halka-ps process in this run's namespaces.
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)
daemon_cpu_s() {
  local ns pid sum=0 f
  for ns in "${NETNS_MADE[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      case "$(cat /proc/"$pid"/comm 2>/dev/null)" in
        halka-worker|halka-ps) ;;
        *) continue ;;
      esac
      f=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' /proc/"$pid"/stat 2>/dev/null) || continue
      sum=$(( sum + ${f:-0} ))
    done
  done
  awk -v t="$sum" -v h="$CLK_TCK" 'BEGIN { printf "%.2f", t / h }'
}
RESULTS="$OUT/results.csv"
OPS="$OUT/ops.csv"
echo "size_mib,G,algo,status,measured_s,min_s,max_s,theory_s,ratio,algbw_MBps,busbw_MBps,sent_B_per_rank,received_B_per_rank,repeats,rate,note,client_s,span_s,span_min_s,span_max_s,span_ratio,daemon_cpu_s_per_op,cpu_busy_pct,load1" >"$RESULTS"
echo "size_mib,G,algo,rank,op,worker_ms,client_ms,sent_B,received_B,wrong,end_unix_ms" >"$OPS"
TABLE=()

theory_s() {  # theory_s ALGO G BYTES
  awk -v a="$1" -v g="$2" -v s="$3" -v r="$RATE_BPS" 'BEGIN {
    if (a == "ring") t = 2 * (g - 1) / g * s / r
    else if (a == "ps") t = g * s / r
    else t = (g - 1) * s / r
    printf "%.4f", t }'
}

add_row() {  # add_row SIZE G ALGO STATUS MEAS MIN MAX SENT RECV NOTE
  local size=$1 g=$2 algo=$3 st=$4 meas=$5 mn=$6 mx=$7 sent=$8 recv=$9 note=${10}
  local bytes=$(( size * 1048576 )) th ratio algbw busbw
  th=$(theory_s "$algo" "$g" "$bytes")
  if [[ "$st" == OK ]]; then
    ratio=$(awk -v m="$meas" -v t="$th" 'BEGIN { printf "%.2f", m / t }')
    algbw=$(awk -v m="$meas" -v b="$bytes" 'BEGIN { printf "%.1f", b / m / 1e6 }')
    busbw=$(awk -v m="$meas" -v b="$bytes" -v g="$g" \
      'BEGIN { printf "%.1f", b / m / 1e6 * 2 * (g - 1) / g }')
  else
    ratio=""; algbw=""; busbw=""
  fi
  local cms=${11:-} smed=${12:-} smin=${13:-} smax=${14:-}
  local cpu=${ROW_CPU:-} load=${ROW_LOAD:-} dcpu=${ROW_DCPU:-} sratio=""
  [[ -n "$smed" ]] && sratio=$(awk -v m="$smed" -v t="$th" 'BEGIN { printf "%.2f", m / t }')
  note=${note//,/;}
  echo "$size,$g,$algo,$st,$meas,$mn,$mx,$th,$ratio,$algbw,$busbw,$sent,$recv,$REPEATS,$RATE,$note,$cms,$smed,$smin,$smax,$sratio,$dcpu,$cpu,$load" >>"$RESULTS"
  TABLE+=("$(printf '%5s %3s %-6s %8s %8s %5s %7s %7s | %7s %5s %7s %7s | %5s %4s%% %5s  %-7s %s' "$size" "$g" "$algo" \
    "$th" "${meas:--}" "${ratio:--}" "${mn:--}" "${mx:--}" "${smed:--}" "${sratio:--}" "${smin:--}" "${smax:--}" \
    "${dcpu:--}" "${cpu:--}" "${load:--}" "$st" "$note")")
  ROW_CPU=""; ROW_LOAD=""; ROW_DCPU=""
  [[ "$st" == OK ]] || ANY_FAILED=1
}

# run_clients TAG G SIZE_MIB ALGO REPEAT : one halkactl per rank, at once;
# sets CLIENT_FAILS to the number of ranks whose halkactl failed or printed
# anything but "#wrong 0" (or fewer than REPEAT lines).
CLIENT_FAILS=0
run_clients() {
  local tag=$1 g=$2 size=$3 algo=$4 rep=$5 op_timeout=${6:-$OP_TIMEOUT}
  local i name pid rc n bound
  local count=$(( size * 262144 ))
  (( size == 0 )) && count=262144      # warm-up: 1 MiB
  bound=$(( rep * op_timeout + 60 ))
  local names=()
  for (( i = 0; i < g; i++ )); do
    name="c-$tag-r$i"
    start_in "${P}w$i" "$name" timeout -k 5 "$bound" "$CTL_BIN" allreduce \
      --worker="$(addr_worker "$i"):$WPORT" --count="$count" --dtype=float32 \
      --op=sum --algo="$algo" --transfer=shm --timeout="${op_timeout}s" \
      --repeat="$rep" --check=true
    names+=("$name")
  done
  CLIENT_FAILS=0
  for (( i = 0; i < g; i++ )); do
    name=${names[$i]}; pid=${PID_OF[$name]}
    wait "$pid"; rc=$?
    unset "PID_OF[$name]"
    n=$(grep -cE '#wrong 0$' "$LOGS/$name.out" 2>/dev/null)
    if (( rc != 0 || n != rep )) || grep -qE '#wrong [1-9]' "$LOGS/$name.out"; then
      CLIENT_FAILS=$(( CLIENT_FAILS + 1 ))
      echo "netns_scaling: rank $i ($tag) failed: rc=$rc, $n of $rep ops with #wrong 0" >&2
      sed 's/^/    | /' "$LOGS/$name.out" "$LOGS/$name.err" 2>/dev/null | tail -n 12 >&2
    fi
  done
}

SEQ=0
WARM_TIMEOUT=$(( OP_TIMEOUT < 30 ? OP_TIMEOUT : 30 ))   # 1 MiB warm-up op
for G in $WORLDS; do
  if (( $(left_s) < 30 )); then
    log "out of time (--max-seconds $MAX_SECONDS): skipping G=$G"
    for size in $SIZES_MIB; do for algo in $ALGOS; do
      [[ $algo == ps && $HAVE_PS == 0 ]] && continue
      add_row "$size" "$G" "$algo" FAILED "" "" "" "" "" "not run: out of time"
    done; done
    continue
  fi
  JOB="scale-g$G"
  WPORT=$(( 7200 + G ))
  PSPORT=$(( 7400 + G ))
  setup_ok=1
  ps_up=0
  if (( WANT_PS && HAVE_PS )); then
    start_in "${P}p" "ps-g$G" "$PS_BIN" --rendezvous="$ADDR_RDV:$RDV_PORT" \
      --job="$JOB" --world_size="$G" --listen="$ADDR_PS:$PSPORT" \
      --advertise="$ADDR_PS:$PSPORT" --undefok=world_size $PS_ARGS
    if wait_listen "${P}p" "ps-g$G" "$PSPORT" 30 &&
       wait_line "ps-g$G" "$LOGS/ps-g$G.err" "registered as parameter server" 30; then
      ps_up=1
    fi
  fi
  log "G=$G: starting $G workers (job $JOB)"
  for (( i = 0; i < G; i++ )); do
    start_in "${P}w$i" "w$i-g$G" "$WORKER_BIN" --rendezvous="$ADDR_RDV:$RDV_PORT" \
      --job="$JOB" --world_size="$G" --worker_id="w$i" --rank="$i" \
      --listen="$(addr_worker "$i"):$WPORT" --default_algorithm=auto \
      --op_timeout="${OP_TIMEOUT}s" --join_timeout=60s $WORKER_ARGS
  done
  for (( i = 0; i < G; i++ )); do
    wait_line "w$i-g$G" "$LOGS/w$i-g$G.err" "joined job" 70 || { setup_ok=0; break; }
  done
  for size in $SIZES_MIB; do
    for algo in $ALGOS; do
      if [[ $algo == ps ]] && (( HAVE_PS == 0 )); then
        continue
      fi
      if (( setup_ok == 0 )); then
        add_row "$size" "$G" "$algo" FAILED "" "" "" "" "" "workers did not form the ring"
        continue
      fi
      if [[ $algo == ps ]] && (( ps_up == 0 )); then
        add_row "$size" "$G" "$algo" FAILED "" "" "" "" "" "halka-ps did not start or register"
        continue
      fi
      SEQ=$(( SEQ + 1 ))
      # Warm-up (1 MiB, same algorithm: opens the links it needs). halka-ps
      # may still be registering: retry a few times, bounded.
      for try in 1 2; do
        run_clients "warm$SEQ-$try" "$G" 0 "$algo" 1 "$WARM_TIMEOUT"
        (( CLIENT_FAILS == 0 )) && break
        sleep 2
      done
      if (( CLIENT_FAILS == 0 )) && [[ $WARMUP == full ]]; then
        # One untimed operation at the timed size: buffers, shm segments,
        # TCP and HTTP/2 windows reach their steady state.
        run_clients "warmfull$SEQ" "$G" "$size" "$algo" 1
      fi
      if (( CLIENT_FAILS > 0 )); then
        add_row "$size" "$G" "$algo" FAILED "" "" "" "" "" "warm-up failed on $CLIENT_FAILS of $G ranks"
        continue
      fi
      log "G=$G $algo ${size} MiB: $REPEATS timed operation(s)"
      tag="run$SEQ"
      cpu0=$(cpu_ticks); dcpu0=$(daemon_cpu_s)
      run_clients "$tag" "$G" "$size" "$algo" "$REPEATS"
      cpu1=$(cpu_ticks); dcpu1=$(daemon_cpu_s)
      ROW_DCPU=$(awk -v a="$dcpu0" -v b="$dcpu1" -v n="$REPEATS" 'BEGIN { printf "%.2f", (b - a) / n }')
      ROW_CPU=$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { split(a, x, " "); split(b, y, " ")
        d = y[1] - x[1]; printf "%.0f", (d > 0 ? 100 * (d - (y[2] - x[2])) / d : 0) }')
      ROW_LOAD=$(cut -d' ' -f1 /proc/loadavg)
      # ops.csv rows, then per-op max over ranks, median over ops.
      for (( i = 0; i < G; i++ )); do
        awk -v size="$size" -v g="$G" -v algo="$algo" '
          /^rank [0-9]+\/[0-9]+: all_reduce #/ {
            split($2, rk, "/"); op = $4; sub("#", "", op)
            cms = ""; wms = ""; sent = ""; recv = ""; wrong = ""; ems = ""
            for (k = 1; k <= NF; k++) {
              if ($k == "in" && $(k+2) == "ms") cms = $(k+1)
              if ($k ~ /^\(worker_ms=/) { wms = $k; gsub(/[^0-9.]/, "", wms) }
              if ($k ~ /^end_unix_ms=/) { ems = $k; gsub(/[^0-9.]/, "", ems) }
              if ($k == "sent") sent = $(k+1)
              if ($k == "received") recv = $(k+1)
              if ($k == "#wrong") wrong = $(k+1)
            }
            printf "%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", size, g, algo, rk[1], op, wms, cms, sent, recv, wrong, ems
          }' "$LOGS/c-$tag-r$i.out" >>"$OPS"
      done
      if (( CLIENT_FAILS > 0 )); then
        add_row "$size" "$G" "$algo" FAILED "" "" "" "" "" "$CLIENT_FAILS of $G ranks failed"
        continue
      fi
      read -r meas mn mx sent recv cmed smed smin smax < <(awk -F, -v size="$size" -v g="$G" -v algo="$algo" '
        $1 == size && $2 == g && $3 == algo {
          if (!($5 in mx) || $6 > mx[$5]) mx[$5] = $6
          if (!($5 in cx) || $7 > cx[$5]) cx[$5] = $7
          # span: the last rank to enter the worker -> the last to leave
          if (!($5 in le) || $11 > le[$5]) le[$5] = $11
          if (!($5 in ls) || $11 - $6 > ls[$5]) ls[$5] = $11 - $6
          if ($8 > sent) sent = $8
          if ($9 > recv) recv = $9
        }
        function median(a, n,   i, j, x) {
          for (i = 2; i <= n; i++) { x = a[i]; j = i - 1
            while (j >= 1 && a[j] > x) { a[j+1] = a[j]; j-- } a[j+1] = x }
          return (n % 2) ? a[(n + 1) / 2] : (a[n/2] + a[n/2 + 1]) / 2
        }
        END {
          n = 0; for (o in mx) { v[++n] = mx[o] / 1000.0; c[n] = cx[o] / 1000.0
                                 sp[n] = (le[o] - ls[o]) / 1000.0 }
          med = median(v, n); cmed = median(c, n); smed = median(sp, n)
          printf "%.4f %.4f %.4f %s %s %.4f %.4f %.4f %.4f\n", med, v[1], v[n], sent, recv, cmed, smed, sp[1], sp[n]
        }' "$OPS")
      add_row "$size" "$G" "$algo" OK "$meas" "$mn" "$mx" "$sent" "$recv" "" "$cmed" "$smed" "$smin" "$smax"
      log "  -> ${meas} s (theory $(theory_s "$algo" "$G" $(( size * 1048576 ))) s)"
    done
  done
  names=()
  for (( i = 0; i < G; i++ )); do names+=("w$i-g$G"); done
  stop_procs "${names[@]}" "ps-g$G"
done

# ------------------------------------------------------------------ report
(( HAVE_PS == 0 && WANT_PS == 1 )) && echo "ps: skipped (halka-ps not built)"
echo
echo "all-reduce float32 sum, links tbf $RATE both ways (mtu $MTU); max_w_s = max"
echo "over ranks of worker_ms, span_s = last rank in -> last rank out; median of"
echo "$REPEATS with min/max; dcpu = daemons' CPU-s per op, cpu = machine busy %;"
echo "theory: ring 2(G-1)/G*S/R, ps G*S/R, naive (G-1)*S/R (S = bytes,"
echo "R = $RATE_BPS B/s)"
printf '%5s %3s %-6s %8s %8s %5s %7s %7s | %7s %5s %7s %7s | %5s %5s %5s  %-7s %s\n' MiB G algo theory_s max_w_s ratio min max span_s ratio min max dcpu cpu load1 status note
for row in "${TABLE[@]}"; do echo "$row"; done
echo
echo "results: $RESULTS"
echo "per op:  $OPS"

# ------------------------------------------------------------------ plot
make_plot() {
  if ! command -v gnuplot >/dev/null 2>&1; then
    if [[ $PLOT == no ]]; then return 0; fi
    if command -v apt-get >/dev/null 2>&1; then
      log "gnuplot missing: apt-get install -y gnuplot-nox"
      DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y gnuplot-nox \
        >"$LOGS/apt-gnuplot.log" 2>&1 || true
    fi
    if ! command -v gnuplot >/dev/null 2>&1; then
      echo "plot: skipped (gnuplot not available)"
      [[ $PLOT == yes ]] && return 1
      return 0
    fi
  fi
  local term="pngcairo size 1000,650 font 'Sans,11'"
  gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1 || term="png size 1000,650"
  local size algo col dt
  local xmin xmax
  xmin=$(echo $WORLDS | tr ' ' '\n' | sort -n | head -1)
  xmax=$(echo $WORLDS | tr ' ' '\n' | sort -n | tail -1)
  for size in $SIZES_MIB; do
    local bytes=$(( size * 1048576 )) png="$OUT/scaling_${size}MiB.png"
    local gp="$LOGS/plot_${size}MiB.gp" plots=()
    for algo in $ALGOS; do
      [[ $algo == ps && $HAVE_PS == 0 ]] && continue
      awk -F, -v s="$size" -v a="$algo" '$1 == s && $3 == a && $4 == "OK" { print $2, $5 }' \
        "$RESULTS" | sort -n >"$LOGS/plot_${size}_${algo}.dat"
      case $algo in ring) col="#1f77b4" ;; ps) col="#2ca02c" ;; *) col="#d62728" ;; esac
      if [[ -s "$LOGS/plot_${size}_${algo}.dat" ]]; then
        plots+=("'$LOGS/plot_${size}_${algo}.dat' using 1:2 with linespoints lw 2 pt 7 ps 1.2 lc rgb '$col' title '$algo measured'")
      fi
      case $algo in
        ring) plots+=("inr(x)*2*(x-1)/x*S/R with lines dt 2 lw 1.5 lc rgb '$col' title 'ring theory 2(G-1)/G·S/R'") ;;
        ps) plots+=("inr(x)*x*S/R with lines dt 2 lw 1.5 lc rgb '$col' title 'ps theory G·S/R'") ;;
        naive) plots+=("inr(x)*(x-1)*S/R with lines dt 2 lw 1.5 lc rgb '$col' title 'naive theory (G-1)·S/R'") ;;
      esac
    done
    local joined="" p
    for p in "${plots[@]}"; do joined+="${joined:+, }$p"; done
    cat >"$gp" <<EOF
set terminal $term
set output '$png'
S = $bytes.0
R = $RATE_BPS.0
set title "halka all-reduce, $size MiB float32: G hosts (netns), every link tbf $RATE both ways\\nmeasured = max over ranks of worker time, median of $REPEATS; dashed = bandwidth bound"
set xlabel 'G (workers)'
set ylabel 'seconds per all-reduce'
set xrange [$(( xmin > 1 ? xmin - 1 : 0 )):$(( xmax + 1 ))]
set xtics (${WORLDS// /, })
set yrange [0:*]
set samples 400
inr(x) = (x >= $xmin && x <= $xmax) ? 1 : 1/0
set grid
set key top left box opaque
plot $joined
EOF
    if timeout 60 gnuplot "$gp" >"$LOGS/plot_${size}MiB.log" 2>&1; then
      echo "plot:    $png"
    else
      echo "plot: gnuplot failed for $size MiB:" >&2
      cat "$LOGS/plot_${size}MiB.log" >&2
      [[ $PLOT == yes ]] && return 1
    fi
  done
  return 0
}
if [[ $PLOT != no ]]; then
  if [[ $PLOT == auto ]] && ! command -v gnuplot >/dev/null 2>&1 &&
     ! command -v apt-get >/dev/null 2>&1; then
    echo "plot: skipped (gnuplot not available)"
  else
    make_plot || ANY_FAILED=1
  fi
fi

echo "end: $(date -u +%FT%TZ); $(uptime)" >>"$OUT/run.txt"
log "done in $(( $(date +%s) - RUN_START )) s"
(( ANY_FAILED )) && exit 1
exit 0
