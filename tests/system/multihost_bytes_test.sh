#!/usr/bin/env bash
# multihost_bytes_test.sh [BUILD_DIR] [--hosts H] [--per-host g] [--mib S]
#                         [--repeat N] [--rate R]
#
# The multi-host test bed: H network namespaces as hosts on one bridge (the
# bridge in a "switch" namespace of its own, 198.18.0.0/15 addresses), each
# running g workers that share its network stack and /dev/shm, and one more
# namespace for the rendezvous. Ranks are dealt to hosts round-robin (rank r
# on host r mod H), the worst join order: in rank order every ring edge
# crosses between hosts.
#
# What it checks, from each host's NIC counters (eth0 tx_bytes in the host's
# namespace, read before and after N ring all-reduces of S MiB per rank):
#   host order  the workers name their host by default (hostname + network
#               namespace, worker/host_identity.h), the rendezvous keeps a
#               host's ranks adjacent, and each host sends exactly one ring
#               edge's bytes: F = N * 2(G-1)/G * S, within [F, 1.08 F]
#               (TCP/IP headers, ACKs for what it receives, frame heads,
#               heartbeats)
#   two-level   the same host-ordered job, --algo=two_level: reduce-scatter
#               inside each host (shared memory), g rings across the hosts
#               (one per local position, over 1/g of the buffer each),
#               all-gather inside each host: each host sends
#               F2 = N * 2(H-1)/H * S, within [F2, 1.08 F2]
#   slices      the same job, reduce-scatter and all-gather of the same
#               whole buffer: on the flat ring each host sends one edge's
#               FR = N * (G-1)/G * S, two-level FS = N * (H-1)/H * S, each
#               within [1.00, 1.08] of it
#   auto        the same job, --algo=auto: two-level (above 64 KiB on hosts
#               of equal g >= 2), the same F2
#   tree        the same job, --algo=tree: a host's workers to its leader
#               (shared memory), a double binary tree of the leaders up
#               and down (tree 0 a heap, host h's parent (h-1)/2; tree 1
#               its mirror, each over half the buffer): host h sends half
#               the buffer per edge it has in either tree:
#               N * edges * S / 2, within [1.00, 1.08] of that
#   rank order  the control: every worker names a host of its own
#               (--host_id), the ring runs in rank order, and each host sends
#               g edges' bytes: at least 0.97 * g * F
# Every operation's result is checked on every rank (#wrong 0), and
# `halkactl health` must report H hosts for the host-ordered job.
#
# Defaults (the CI form, CTest system_multihost_bytes): --hosts 2 --per-host
# 2 --mib 4 --repeat 3, no shaping. The issue's form: --hosts 2 --per-host 4
# (or 4 x 2); --rate 1gbit caps every host's link with tc tbf both ways.
#
# Exit: 0 pass, 1 fail, 77 skip (not root, or no netns/veth/bridge).
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/system/lib.sh
source "$HERE/lib.sh"
# shellcheck source=tests/system/netns.sh
source "$HERE/netns.sh"

BUILD_ARG=""
H=2 PER=2 MIB=4 REPEAT=3 RATE=""
while (( $# )); do
  case $1 in
    --hosts) H=$2; shift 2 ;;
    --per-host) PER=$2; shift 2 ;;
    --mib) MIB=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    -*) echo "FAIL: unknown option $1"; exit 1 ;;
    *) BUILD_ARG=$1; shift ;;
  esac
done
for v in "$H" "$PER" "$MIB" "$REPEAT"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "FAIL: --hosts/--per-host/--mib/--repeat take a whole number >= 1"; exit 1; }
done
(( H >= 2 && H <= 16 && PER <= 8 )) || { echo "FAIL: --hosts 2..16, --per-host 1..8"; exit 1; }
sys_binaries "$BUILD_ARG"

G=$(( H * PER ))
COUNT=$(( MIB * 262144 ))          # float32
BYTES=$(( MIB * 1048576 ))
# Reduce-scatter and all-gather: the whole buffer in G equal slices.
SCOUNT=$(( COUNT - COUNT % G ))
SBYTES=$(( SCOUNT * 4 ))
P="mh$$-"                          # unique per run; interface names stay short
NET=198.18.41
ADDR_RDV=$NET.2
RDV_PORT=7100
RDV_ADDR="$ADDR_RDV:$RDV_PORT"
addr_host() { echo "$NET.$(( 10 + $1 ))"; }
host_of() { echo $(( $1 % H )); }
port_of() { echo $(( 7200 + $1 / H )); }   # the rank's index on its host

# ------------------------------------------------------------ network

sys_init
netns_switch
netns_add_host r "$ADDR_RDV" || netns_skip "cannot build host ${P}r (veth into a namespace)"
for (( h = 0; h < H; ++h )); do
  netns_add_host "h$h" "$(addr_host $h)" || fail "cannot build host ${P}h$h"
  if [[ -n $RATE ]]; then
    command -v tc >/dev/null 2>&1 || netns_skip "--rate needs tc"
    netns_cap_host "h$h" "$RATE" || fail "tc tbf on ${P}h$h"
  fi
done
log "$H hosts x $PER workers (G=$G) on br0 in $SW${RATE:+, links capped at $RATE both ways}; logs in $SYS_LOG"

start_daemon rdv ip netns exec "${P}r" "$RDV_BIN" --listen="$RDV_ADDR" \
  --heartbeat_interval=500ms --heartbeat_timeout=10s
wait_for_line rdv "^halka-rendezvous listening on " 15

tx_bytes() {  # tx_bytes HOST: what the host's NIC has sent so far
  ip netns exec "${P}h$1" cat /sys/class/net/eth0/statistics/tx_bytes
}

# allreduce_all NAME REPEAT [ALGO [COLL]]: every rank runs REPEAT checked
# collectives (COLL: allreduce, default, reducescatter or allgather of the
# same whole buffer; ALGO, default ring) at once; fails unless each rank
# printed REPEAT lines with #wrong 0.
allreduce_all() {
  local r h names=() algo=${3:-ring} coll=${4:-allreduce} count=$COUNT kind ran
  case $coll in
    allreduce) kind=all_reduce ;;
    reducescatter) kind=reduce_scatter; count=$SCOUNT ;;
    allgather) kind=all_gather; count=$(( SCOUNT / G )) ;;
    *) fail "allreduce_all: unknown collective $coll" ;;
  esac
  for (( r = 0; r < G; ++r )); do
    h=$(host_of $r)
    run_bg "$1.r$r" ip netns exec "${P}h$h" timeout --foreground -s KILL 170 \
      "$CTL_BIN" allreduce --worker="$(addr_host $h):$(port_of $r)" --algo="$algo" \
      --coll="$coll" --count=$count --dtype=float32 --op=sum --repeat="$2" \
      --timeout=60s --transfer=shm --check=true
    names+=("$1.r$r")
  done
  wait_bg 180 "${names[@]}"
  for (( r = 0; r < G; ++r )); do
    [[ "$(bg_rc "$1.r$r")" == 0 ]] ||
      fail "$1: halkactl allreduce --coll=$coll on rank $r exited $(bg_rc "$1.r$r"): $(tail -n 5 "$SYS_LOG/$1.r$r.err" "$SYS_LOG/$1.r$r.out")"
    ran=$algo
    [[ $algo == auto ]] && ran='[a-z_]+'
    assert_eq "$(grep -cE "^rank $r/$G: $kind #[0-9]+ .* algo=$ran .*#wrong 0\$" "$SYS_LOG/$1.r$r.out")" \
      "$2" "$1: rank $r's $kind lines with algo=$algo and #wrong 0"
  done
}
# run_job TAG HOST_ID_MODE: G workers (rank r on host r mod H), one warm-up
# all-reduce, then REPEAT timed ones on every rank; sets TX[h] to what host
# h sent during the timed ones. HOST_ID_MODE: "default" or "own".
declare -a TX
run_job() {
  local tag=$1 mode=$2 job="mh-$1-$$" r
  netns_start_workers "$tag" "$mode" "$job"
  for (( r = 0; r < G; ++r )); do
    wait_for_line "$tag.w$r" "^halka-worker serving on " 15
    wait_for_line "$tag.w$r" "joined job $job: rank $r of $G" 30 "$SYS_LOG/$tag.w$r.err"
  done
  measure "$tag" ring
  JOB=$job
}
# measure TAG ALGO [COLL]: one warm-up collective (opens every link it
# uses), then REPEAT timed ones; sets TX[h] and OP_MS.
measure() {
  local tag=$1 algo=$2 coll=${3:-allreduce} h before=() t0
  allreduce_all "$tag.warm" 1 "$algo" "$coll"
  for (( h = 0; h < H; ++h )); do before[h]=$(tx_bytes $h); done
  t0=$(now_ns)
  allreduce_all "$tag.timed" "$REPEAT" "$algo" "$coll"
  OP_MS=$(awk -v ms="$(ms_since "$t0")" -v n="$REPEAT" 'BEGIN { printf "%.1f", ms / n }')
  for (( h = 0; h < H; ++h )); do TX[h]=$(( $(tx_bytes $h) - before[h] )); done
}

# F: what one ring edge carries in the timed all-reduces.
F=$(( REPEAT * 2 * (G - 1) * BYTES / G ))
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }

# ------------------------------------------------------------ host order

run_job hostorder default
HEALTH=$(ip netns exec "${P}r" timeout --foreground -s KILL 15 "$CTL_BIN" health \
           --rendezvous="$RDV_ADDR" --job="$JOB" 2>&1)
grep -qE "on $H hosts" <<<"$HEALTH" ||
  fail "health of the host-ordered job does not say 'on $H hosts':
$HEALTH"
log "host order: $(head -n 1 <<<"$HEALTH"); $REPEAT all-reduces of $MIB MiB, $OP_MS ms each (wall, every rank)"
# expect_tx WHAT WANT_B WANT_TEXT: every host sent within [1.00, 1.08] x
# WANT_B during the last measure.
expect_tx() {
  local h q
  for (( h = 0; h < H; ++h )); do
    q=$(ratio "${TX[h]}" "$2")
    log "$1: host $h sent ${TX[h]} B = $q x $3 ($2 B)"
    awk -v q="$q" 'BEGIN { exit !(q >= 1.0 && q <= 1.08) }' ||
      fail "$1: host $h sent $q x $3 (want 1.00..1.08)"
  done
}
expect_tx "host order" "$F" "one ring edge's bytes (one host-boundary edge)"
if (( PER >= 2 )); then
  measure hostorder.2l two_level
  F2=$(( REPEAT * 2 * (H - 1) * BYTES / H ))
  log "two-level: $REPEAT all-reduces of $MIB MiB, $OP_MS ms each (wall, every rank)"
  expect_tx "two-level" "$F2" "2(H-1)/H of the buffer"
  # auto takes two-level above 64 KiB on hosts of equal g >= 2.
  measure hostorder.auto auto
  log "auto: $REPEAT all-reduces of $MIB MiB, $OP_MS ms each (wall, every rank)"
  expect_tx "auto (two-level)" "$F2" "2(H-1)/H of the buffer"
  # Reduce-scatter and all-gather of the same whole buffer: two-level sends
  # (H-1)/H of it per host (the flat ring in host order: (G-1)/G).
  FS=$(( REPEAT * (H - 1) * SBYTES / H ))
  FR=$(( REPEAT * (G - 1) * SBYTES / G ))
  for coll in reducescatter allgather; do
    measure "hostorder.$coll.ring" ring "$coll"
    log "ring $coll: $REPEAT of $MIB MiB, $OP_MS ms each (wall, every rank)"
    expect_tx "ring $coll" "$FR" "(G-1)/G of the buffer"
    measure "hostorder.$coll" two_level "$coll"
    log "two-level $coll: $REPEAT of $MIB MiB, $OP_MS ms each (wall, every rank)"
    expect_tx "two-level $coll" "$FS" "(H-1)/H of the buffer"
  done
fi
# The double binary tree: in each of its two trees (tree 0 a heap over the
# hosts, tree 1 its mirror: host h in place H-1-h), host h's leader sends
# that tree's half of the buffer up to its parent and down to each child;
# nothing else leaves a host.
measure hostorder.tree tree
log "tree: $REPEAT all-reduces of $MIB MiB, $OP_MS ms each (wall, every rank)"
tree_edges() { local p=$1; echo $(( (p > 0) + (2 * p + 1 < H) + (2 * p + 2 < H) )); }
for (( h = 0; h < H; ++h )); do
  edges=$(( $(tree_edges $h) + $(tree_edges $(( H - 1 - h ))) ))
  FT=$(( REPEAT * edges * BYTES / 2 ))
  q=$(ratio "${TX[h]}" "$FT")
  log "tree: host $h sent ${TX[h]} B = $q x half the buffer per edge of its $edges in the two trees ($FT B)"
  awk -v q="$q" 'BEGIN { exit !(q >= 1.0 && q <= 1.08) }' ||
    fail "tree: host $h sent $q x its tree edges' bytes (want 1.00..1.08)"
done
for (( r = 0; r < G; ++r )); do stop_timed "hostorder.w$r" TERM 15; done

# ------------------------------------------------------------ rank order

run_job rankorder own
log "rank order (control): $REPEAT all-reduces of $MIB MiB, $OP_MS ms each (wall, every rank)"
for (( h = 0; h < H; ++h )); do
  q=$(ratio "${TX[h]}" "$F")
  log "rank order (control): host $h sent ${TX[h]} B = $q x one edge's $F B"
  awk -v q="$q" -v g="$PER" 'BEGIN { exit !(q >= 0.97 * g) }' ||
    fail "rank order: host $h sent $q x one edge's bytes (want >= $PER: the control must show g crossing edges)"
done

echo "PASS: $H hosts x $PER workers: host-ordered rings send one ring edge per host across hosts (rank order: $PER; two-level and auto: 2(H-1)/H of the buffer, its reduce-scatter and all-gather (H-1)/H; tree: half the buffer per edge of either of its two trees)"
