#!/usr/bin/env bash
# multihost_probe_test.sh [BUILD_DIR] [--hosts H] [--per-host g] [--rate R]
#
# The measured link model (halka-rendezvous --link_model=probe,
# docs/scaling.md) on the multi-host test bed: H network namespaces as
# hosts on one bridge (198.18.42.0/24), each running g workers that share
# its network stack and /dev/shm, every host's link capped with tc tbf at
# R both ways. The job's members probe their ring links as the ring forms,
# and the rendezvous publishes the medians as generation 2.
#
# What it checks, from `halkactl health`:
#   - the model was measured on generation 1 by all G members, and the
#     job runs generation 2;
#   - net B lies within [0.5, 1.6] x R (the cap: 1 MiB messages through a
#     tbf with a 256 KB burst), local B (shared memory inside a host) is
#     above 3 x R;
#   - two checked all-reduces of 4 MiB on every rank, with #wrong 0, say
#     what the measured model predicted for them (model_ms: the ring of
#     generation 1 had no model).
#
# Defaults (the CI form, CTest system_multihost_probe): --hosts 2
# --per-host 2 --rate 100mbit.
#
# Exit: 0 pass, 1 fail, 77 skip (not root, no netns/veth/bridge, no tc).
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/system/lib.sh
source "$HERE/lib.sh"
# shellcheck source=tests/system/netns.sh
source "$HERE/netns.sh"

BUILD_ARG=""
H=2 PER=2 RATE=100mbit
while (( $# )); do
  case $1 in
    --hosts) H=$2; shift 2 ;;
    --per-host) PER=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    -*) echo "FAIL: unknown option $1"; exit 1 ;;
    *) BUILD_ARG=$1; shift ;;
  esac
done
for v in "$H" "$PER"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "FAIL: --hosts/--per-host take a whole number >= 1"; exit 1; }
done
(( H >= 2 && H <= 16 && PER >= 2 && PER <= 8 )) || { echo "FAIL: --hosts 2..16, --per-host 2..8"; exit 1; }
[[ $RATE =~ ^([0-9]+)(mbit|gbit)$ ]] || { echo "FAIL: --rate takes Nmbit or Ngbit"; exit 1; }
RATE_BPS=$(( BASH_REMATCH[1] * 125000 ))   # bytes/s
[[ ${BASH_REMATCH[2]} == gbit ]] && RATE_BPS=$(( RATE_BPS * 1000 ))
sys_binaries "$BUILD_ARG"
command -v tc >/dev/null 2>&1 || { echo "SKIP: needs tc (iproute2) for the tbf cap"; exit 77; }

G=$(( H * PER ))
P="mp$$-"
NET=198.18.42
ADDR_RDV=$NET.2
RDV_ADDR="$ADDR_RDV:7100"
addr_host() { echo "$NET.$(( 10 + $1 ))"; }
host_of() { echo $(( $1 % H )); }
port_of() { echo $(( 7200 + $1 / H )); }

sys_init
netns_switch
netns_add_host r "$ADDR_RDV" || netns_skip "cannot build host ${P}r (veth into a namespace)"
for (( h = 0; h < H; ++h )); do
  netns_add_host "h$h" "$(addr_host $h)" || fail "cannot build host ${P}h$h"
  netns_cap_host "h$h" "$RATE" || fail "tc tbf on ${P}h$h"
done
log "$H hosts x $PER workers (G=$G), links capped at $RATE ($RATE_BPS B/s) both ways; logs in $SYS_LOG"

start_daemon rdv ip netns exec "${P}r" "$RDV_BIN" --listen="$RDV_ADDR" \
  --heartbeat_interval=500ms --heartbeat_timeout=10s --link_model=probe
wait_for_line rdv "^halka-rendezvous listening on " 15

JOB="mp-$$"
for (( r = 0; r < G; ++r )); do
  h=$(host_of $r)
  start_daemon "w$r" ip netns exec "${P}h$h" "$WORKER_BIN" \
    --rendezvous="$RDV_ADDR" --job="$JOB" --world_size=$G --worker_id="w$r" \
    --rank=$r --listen="$(addr_host $h):$(port_of $r)"
done
for (( r = 0; r < G; ++r )); do
  wait_for_line "w$r" "^halka-worker serving on " 15
  wait_for_line "w$r" "joined job $JOB: rank $r of $G" 30 "$SYS_LOG/w$r.err"
done

health() {
  ip netns exec "${P}r" timeout --foreground -s KILL 15 "$CTL_BIN" health \
    --rendezvous="$RDV_ADDR" --job="$JOB" 2>&1
}
HEALTH=""
for (( i = 0; i < 60; ++i )); do
  HEALTH=$(health)
  grep -q "measured at generation 1" <<<"$HEALTH" && break
  sleep 0.5
done
grep -q "measured at generation 1" <<<"$HEALTH" ||
  fail "no measured link model 30 s after the job formed:
$HEALTH
$(grep -h 'probed the ring links' "$SYS_LOG"/w*.err)"
grep -h 'probed the ring links' "$SYS_LOG"/w*.err | while read -r l; do log "worker: $l"; done
MODEL=$(grep -m1 '^link model' <<<"$HEALTH")
log "$MODEL"
grep -q "measured on generation 1 by $G of $G members" <<<"$HEALTH" ||
  fail "health does not say all $G members measured it:
$HEALTH"
# "local: alpha A us, B X GB/s; net: alpha A us, B Y GB/s, measured ..."
LOCAL_B=$(sed -nE 's/.*local: alpha [0-9.]+ us, B ([0-9.]+) GB\/s.*/\1/p' <<<"$MODEL")
NET_B=$(sed -nE 's/.*net: alpha [0-9.]+ us, B ([0-9.]+) GB\/s.*/\1/p' <<<"$MODEL")
[[ -n $LOCAL_B && -n $NET_B ]] || fail "cannot read both levels' B from: $MODEL"
NET_Q=$(awk -v b="$NET_B" -v r="$RATE_BPS" 'BEGIN { printf "%.3f", b * 1e9 / r }')
LOCAL_Q=$(awk -v b="$LOCAL_B" -v r="$RATE_BPS" 'BEGIN { printf "%.1f", b * 1e9 / r }')
log "net B = $NET_Q x the cap, local B = $LOCAL_Q x the cap"
awk -v q="$NET_Q" 'BEGIN { exit !(q >= 0.5 && q <= 1.6) }' ||
  fail "net B is $NET_Q x the $RATE cap (want 0.5..1.6): $MODEL"
awk -v q="$LOCAL_Q" 'BEGIN { exit !(q > 3) }' ||
  fail "local B is only $LOCAL_Q x the $RATE cap (want > 3): $MODEL"

# Every rank runs a checked all-reduce on the published generation, and
# auto ranks by the model (model_ms in its line).
names=()
for (( r = 0; r < G; ++r )); do
  h=$(host_of $r)
  run_bg "ar.r$r" ip netns exec "${P}h$h" timeout --foreground -s KILL 120 \
    "$CTL_BIN" allreduce --worker="$(addr_host $h):$(port_of $r)" --algo=auto \
    --count=1048576 --dtype=float32 --op=sum --repeat=2 --timeout=60s \
    --transfer=shm --check=true
  names+=("ar.r$r")
done
wait_bg 130 "${names[@]}"
for (( r = 0; r < G; ++r )); do
  [[ "$(bg_rc "ar.r$r")" == 0 ]] ||
    fail "halkactl allreduce on rank $r exited $(bg_rc "ar.r$r"): $(tail -n 5 "$SYS_LOG/ar.r$r.err" "$SYS_LOG/ar.r$r.out")"
  assert_eq "$(grep -cE "^rank $r/$G: all_reduce #[0-9]+ .*model_ms=[0-9.]+.*#wrong 0\$" "$SYS_LOG/ar.r$r.out")" \
    2 "rank $r's all-reduce lines with the measured model's prediction (model_ms; generation 1 had no model) and #wrong 0"
done
log "rank 0: $(tail -n 1 "$SYS_LOG/ar.r0.out")"
echo "PASS: $H hosts x $PER workers at $RATE: the members measured net B = $NET_Q x the cap and local B = $LOCAL_Q x it, published as generation 2, and auto ran by it"
