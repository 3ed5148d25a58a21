#!/usr/bin/env bash
# health_tbf_test.sh BUILD_DIR — ring health on a real, shaped link.
#
# A rendezvous and 4 workers, each in a network namespace of its own on one
# bridge (the bridge in a "switch" namespace of its own, as
# bench/scaling/netns_scaling.sh builds it; 198.19.7.0/24). Only rank 2's
# outgoing link (egress of eth0 in its namespace) is capped with tc tbf at
# 50mbit; every other link is unshaped. Every rank runs
# `halkactl allreduce --algo=ring` concurrently (8 MiB float32, --repeat=4),
# then, after a heartbeat, `halkactl health` (text and --json) must name edge
# 2->3 as the slowest ring edge and rank 2 as the straggler.
#
# Exit: 0 pass, 1 fail, 77 skip (not root, or no netns/veth/bridge/tbf).
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/system/lib.sh
source "$HERE/lib.sh"
# shellcheck source=tests/system/netns.sh
source "$HERE/netns.sh"
sys_binaries "${1:-}"

skip() { echo "SKIP: needs root, ip netns, veth, bridge and tc tbf ($*)"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "FAIL: python3 needed to check --json"; exit 1; }


G=4
SLOW=2                     # the rank whose outgoing link is capped
RATE=50mbit
COUNT=$(( 8 * 1024 * 1024 / 4 ))   # float32: 8 MiB per rank
REPEAT=4
JOB="health-tbf-$$"
P="ht$$-"                  # unique per run; interface names stay short
NET=198.19.7
ADDR_RDV=$NET.2
RDV_PORT=7100
addr_worker() { echo "$NET.$(( 10 + $1 ))"; }

# ------------------------------------------------------------ network

sys_init
netns_switch
command -v tc >/dev/null 2>&1 || skip "no tc command"
netns_add_host r "$ADDR_RDV" || skip "cannot build host ${P}r (veth into a namespace)"
for (( r = 0; r < G; ++r )); do
  netns_add_host "w$r" "$(addr_worker $r)" || fail "cannot build host ${P}w$r"
done
ip netns exec "${P}w$SLOW" tc qdisc replace dev eth0 root tbf rate "$RATE" \
  burst 32kb latency 400ms || skip "tc tbf does not work here"
log "hosts on br0 in $SW; rank $SLOW's egress: $(ip netns exec "${P}w$SLOW" tc qdisc show dev eth0)"
for (( r = 0; r < G; ++r )); do
  (( r == SLOW )) && continue
  ip netns exec "${P}w$r" tc qdisc show dev eth0 | grep -q tbf && fail "rank $r is shaped"
done

# ------------------------------------------------------------ job

log "logs in $SYS_LOG"
start_daemon rdv ip netns exec "${P}r" "$RDV_BIN" --listen="$ADDR_RDV:$RDV_PORT" \
  --heartbeat_interval=500ms --heartbeat_timeout=10s
wait_for_line rdv "^halka-rendezvous listening on " 15
RDV_ADDR="$ADDR_RDV:$RDV_PORT"
declare -a ADDR
for (( r = 0; r < G; ++r )); do
  ADDR[r]="$(addr_worker $r):7200"
  start_daemon "w$r" ip netns exec "${P}w$r" "$WORKER_BIN" --rendezvous="$RDV_ADDR" \
    --job="$JOB" --world_size=$G --worker_id="w$r" --rank=$r --listen="${ADDR[r]}"
done
for (( r = 0; r < G; ++r )); do
  wait_for_line "w$r" "^halka-worker serving on " 15
  wait_for_line "w$r" "joined job $JOB: rank $r of $G" 30 "$SYS_LOG/w$r.err"
done
log "rendezvous on $RDV_ADDR, $G workers joined"

# ------------------------------------------------------------ all-reduces

t0=$(now_ns)
names=()
for (( r = 0; r < G; ++r )); do
  run_bg "ar.r$r" ip netns exec "${P}w$r" timeout --foreground -s KILL 150 "$CTL_BIN" \
    allreduce --worker="${ADDR[r]}" --algo=ring --count=$COUNT --dtype=float32 \
    --op=sum --repeat=$REPEAT --timeout=60s
  names+=("ar.r$r")
done
wait_bg 170 "${names[@]}"
ar_ms=$(ms_since "$t0")
for (( r = 0; r < G; ++r )); do
  f="$SYS_LOG/ar.r$r"
  [[ "$(bg_rc "ar.r$r")" == 0 ]] ||
    fail "halkactl allreduce on rank $r exited $(bg_rc "ar.r$r"): $(tail -n 5 "$f.err" "$f.out")"
  ok=$(grep -cE "^rank $r/$G: all_reduce #[0-9]+ .*#wrong 0\$" "$f.out")
  assert_eq "$ok" "$REPEAT" "rank $r: all_reduce lines with #wrong 0"
done
log "$G x $REPEAT ring all-reduces of 8 MiB in $(fmt_s "$ar_ms") s; $(head -n1 "$SYS_LOG/ar.r0.out")"

# ------------------------------------------------------------ health

# Wait (bounded) until a heartbeat after the last operation reached the
# rendezvous: every member's telemetry shows all its operations completed.
HEALTH_OUT=""
health() {
  HEALTH_OUT=$(ip netns exec "${P}r" timeout --foreground -s KILL 15 "$CTL_BIN" health \
                 --rendezvous="$RDV_ADDR" --job="$JOB" "$@" 2>&1)
}
t0=$(now_ns)
while :; do
  health --json
  done_ranks=$(python3 -c 'import json,sys
h = json.loads(sys.stdin.read()); n = int(sys.argv[1])
t = h.get("telemetry", [])
print(sum(1 for x in t if int(x.get("ops_completed", 0)) >= n and not x.get("current_op")))' \
    "$REPEAT" <<<"$HEALTH_OUT" 2>/dev/null)
  [[ "$done_ranks" == "$G" ]] && break
  (( $(now_ns) - t0 > 15 * 1000000000 )) &&
    fail "15 s after the all-reduces the rendezvous has not heard of them from every rank:
$HEALTH_OUT"
  sleep 0.2
done
sleep 1   # one more heartbeat (500 ms) so every window is current
health
printf '%s\n' "$HEALTH_OUT"
slow_row=$(grep -E '<- slowest' <<<"$HEALTH_OUT")
[[ "$(wc -l <<<"$slow_row")" == 1 && -n "$slow_row" ]] ||
  fail "health: expected exactly one '<- slowest' edge, got: '$slow_row'"
[[ "$slow_row" =~ ^[[:space:]]*\*$SLOW-\>$(( (SLOW + 1) % G ))[[:space:]] ]] ||
  fail "health: the slowest edge is not *$SLOW->$(( (SLOW + 1) % G )): '$slow_row'"
grep -qE "^diagnosis: rank $SLOW is the straggler: " <<<"$HEALTH_OUT" ||
  fail "health: no 'diagnosis: rank $SLOW is the straggler' line"

health --json
HJ=$HEALTH_OUT python3 - "$SLOW" "$G" <<'PYEOF' || fail "health --json does not name rank $SLOW / edge $SLOW->$(( (SLOW + 1) % G )):
$HEALTH_OUT"
import json, os, sys
slow, g = int(sys.argv[1]), int(sys.argv[2])
h = json.loads(os.environ["HJ"])
d = h.get("diagnosis", {})
assert d.get("has_straggler") is True, d
assert int(d.get("straggler_rank", 0)) == slow, d
assert int(d.get("slowest_from", 0)) == slow, d
assert int(d.get("slowest_to", 0)) == (slow + 1) % g, d
assert d.get("summary", "").startswith("rank %d is the straggler" % slow), d
ring = [e for e in h["edges"] if e.get("ring")]
assert len(ring) == g, ring
e = [x for x in ring if int(x.get("from", 0)) == slow][0]
others = [float(x.get("throughput_bps", 0)) for x in ring if x is not e]
assert float(e.get("throughput_bps", 0)) < min(others), (e, others)
# The edge's MB/s is a link rate: bytes over the time the sender's link was
# writing them, so the shaped edge reads near its 50 Mbit/s (6.25 MB/s), not
# bytes over the wait it adds (which read 100x the link). Writes complete
# into the socket buffer, so allow up to 3x.
assert 0 < float(e["throughput_bps"]) <= 3 * 6.25e6, e
assert int(d.get("late_rank", 0)) == -1 and int(d.get("stalled_rank", 0)) == -1, d
print("json: straggler", d["straggler_rank"], "slowest edge %d->%d" % (slow, (slow + 1) % g),
      "throughput %.1f MB/s vs others %s" % (float(e["throughput_bps"]) / 1e6,
      ["%.1f" % (o / 1e6) for o in others]))
PYEOF

log "PASS: health names edge $SLOW->$(( (SLOW + 1) % G )) slowest and rank $SLOW the straggler (tbf $RATE on rank $SLOW's egress)"
echo "PASS"
