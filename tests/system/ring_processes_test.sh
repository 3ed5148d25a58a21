#!/usr/bin/env bash
# System test: a rendezvous and 4 workers as separate processes on 127.0.0.1,
# driven by `halkactl`.
#
#   ring_processes_test.sh HALKA_RENDEZVOUS HALKA_WORKER HALKACTL
#
#   a. all-reduce cases through every worker at once, each checked against
#      the float64 reference by halkactl (#wrong 0)
#   b. `halkactl health`: healthy, 4 rows alive
#   c. SIGKILL rank 2's worker during back-to-back 200 MB all-reduces: every halkactl
#      returns (non-zero) within the 20 s deadline + 5 s, and the survivors
#      name the dead rank
#   d. `halkactl health` reports the job degraded, rank 2 not alive
#   e. SIGTERM: every remaining daemon exits within 1 s
#
# Exits 0 only if every assertion holds; on failure the logs are kept and
# their tails printed.
set -u -o pipefail

if (( $# != 3 )); then
  echo "usage: $0 HALKA_RENDEZVOUS HALKA_WORKER HALKACTL" >&2
  exit 2
fi
RDV_BIN=$1 WORKER_BIN=$2 CTL_BIN=$3
for b in "$RDV_BIN" "$WORKER_BIN" "$CTL_BIN"; do
  [[ -x "$b" ]] || { echo "not an executable: $b" >&2; exit 2; }
done

# shellcheck source=tests/system/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sys_init

G=4
DEAD=2                      # the rank whose worker gets SIGKILLed
JOB="system-ring-$$"
KILL_COUNT=50000000         # float32: 200 MB per rank
# All-reduces run back to back (unchecked) until the kill: one takes only
# 0.3-2 s in the workers here, less than the telemetry's age plus the
# kill's own delay, so a single one could end before the kill lands.
KILL_REPEAT=40
KILL_DEADLINE_S=20
HB_INTERVAL=500ms
HB_TIMEOUT=3s
SUMMARY=()                  # lines of the final table

summary() { SUMMARY+=("$(printf '%-76s %s' "$1" "$2")"); }

# health_table -> prints `halkactl health`, sets HEALTH_RC and HEALTH_OUT
HEALTH_RC=""; HEALTH_OUT=""
health() {
  HEALTH_OUT=$(timeout --foreground -s KILL 15 "$CTL_BIN" health --rendezvous="$RDV_ADDR" \
                 --job="$JOB" 2>&1)
  HEALTH_RC=$?
}
# health_rows: "rank worker address alive now..." per member row (the
# table's row: rank pos worker host address alive hb_age ok failed sent_MB
# recv_MB wait_s now...; every worker names its host)
health_rows() {
  awk '$1 ~ /^[0-9]+$/ && $2 ~ /^-?[0-9]+$/ && NF >= 13 { now = $13;
         for (i = 14; i <= NF; ++i) now = now " " $i;
         print $1, $3, $5, $6, now }' <<<"$HEALTH_OUT"
}

# ------------------------------------------------------------ start the job

log "logs in $SYS_LOG"
rdv_port=$(free_port) || fail "no free port"
RDV_METRICS=$(free_port) || fail "no free port"
W0_METRICS=$(free_port) || fail "no free port"
start_daemon rdv "$RDV_BIN" --listen="127.0.0.1:$rdv_port" --metrics_port="$RDV_METRICS" \
  --heartbeat_interval="$HB_INTERVAL" --heartbeat_timeout="$HB_TIMEOUT"
wait_for_line rdv "^halka-rendezvous listening on " 10
RDV_ADDR=$(sed -n 's/^halka-rendezvous listening on //p' "$SYS_LOG/rdv.out" | head -n1)
assert_eq "$RDV_ADDR" "127.0.0.1:$rdv_port" "rendezvous address"
log "rendezvous pid ${SYS_PID[rdv]} on $RDV_ADDR"

declare -a ADDR
for (( r = 0; r < G; ++r )); do
  port=$(free_port) || fail "no free port"
  start_daemon "w$r" "$WORKER_BIN" --rendezvous="$RDV_ADDR" --job="$JOB" \
    --world_size=$G --worker_id="w$r" --rank=$r --listen="127.0.0.1:$port" \
    $( (( r == 0 )) && echo "--metrics_port=$W0_METRICS")
  ADDR[r]="127.0.0.1:$port"
done
for (( r = 0; r < G; ++r )); do
  wait_for_line "w$r" "^halka-worker serving on " 10
  a=$(sed -n 's/^halka-worker serving on //p' "$SYS_LOG/w$r.out" | head -n1)
  assert_eq "$a" "${ADDR[r]}" "worker w$r address"
done
for (( r = 0; r < G; ++r )); do
  wait_for_line "w$r" "joined job $JOB: rank $r of $G" 30 "$SYS_LOG/w$r.err"
  log "worker w$r pid ${SYS_PID[w$r]} on ${ADDR[r]}: rank $r of $G"
done

# ------------------------------------------------------------ a. all-reduce

# allreduce_case NAME REPEAT FLAGS... : one halkactl per worker, concurrently.
allreduce_case() {
  local name=$1 repeat=$2; shift 2
  local r names=() t0 ms
  t0=$(now_ns)
  for (( r = 0; r < G; ++r )); do
    run_bg "$name.r$r" timeout --foreground -s KILL 90 "$CTL_BIN" allreduce \
      --worker="${ADDR[r]}" "$@"
    names+=("$name.r$r")
  done
  wait_bg 100 "${names[@]}"
  ms=$(ms_since "$t0")
  for (( r = 0; r < G; ++r )); do
    local f="$SYS_LOG/$name.r$r"
    [[ "$(bg_rc "$name.r$r")" == 0 ]] ||
      fail "case $name: halkactl on rank $r exited $(bg_rc "$name.r$r"):
$(tail -n 5 "$f.err" "$f.out")"
    if grep -qE '#wrong [1-9]' "$f.out"; then
      fail "case $name rank $r: wrong elements: $(grep -E '#wrong [1-9]' "$f.out" | head -n1)"
    fi
    local ok
    ok=$(grep -cE "^rank $r/$G: all_reduce #[0-9]+ .*#wrong 0\$" "$f.out")
    assert_eq "$ok" "$repeat" "case $name rank $r: lines 'rank $r/$G: all_reduce ... #wrong 0'"
  done
  log "case $name ($*): ok in $(fmt_s "$ms") s; $(head -n1 "$SYS_LOG/$name.r0.out")"
  summary "a. $name ($*)" "$(fmt_s "$ms") s"
}

allreduce_case one    1  --count=1 --dtype=float32 --op=sum --timeout=10s
allreduce_case f32sum 1  --count=1000003 --dtype=float32 --op=sum --timeout=10s
# auto runs halving_doubling there (4 ranks, 4 MB), whose partners are not
# all ring neighbours: the ring itself too, for health's G ring edges below.
allreduce_case f32ring 1 --count=1000003 --dtype=float32 --op=sum --timeout=10s \
  --algo=ring
allreduce_case i64max 1  --count=4097 --dtype=int64 --op=max --timeout=10s
allreduce_case bf16avg 1 --count=65536 --dtype=bfloat16 --op=avg --timeout=10s
allreduce_case repeat20 20 --count=1000 --dtype=float32 --op=sum --timeout=10s \
  --repeat=20

# ------------------------------------------------------------ b. health

# Health reads what the workers' heartbeats (every $HB_INTERVAL) carried:
# ask until every rank's "ok" column counts the 25 operations above (at
# most 10 s), so the edges below include the ring case's.
OPS_RUN=25
# rows_counted N: how many member rows' "ok" column reached N.
rows_counted() {
  awk -v n="$1" '$1 ~ /^[0-9]+$/ && $2 ~ /^-?[0-9]+$/ && NF >= 13 &&
                 $8 + 0 >= n' <<<"$HEALTH_OUT" | wc -l
}
for (( i = 0; i < 40; ++i )); do
  health
  [[ "$(rows_counted "$OPS_RUN")" == "$G" ]] && break
  sleep 0.25
done
printf '%s\n' "$HEALTH_OUT"
assert_eq "$(rows_counted "$OPS_RUN")" "$G" \
  "health rows whose heartbeats counted all $OPS_RUN operations"
assert_eq "$HEALTH_RC" 0 "halkactl health exit status (healthy job)"
rows=$(health_rows)
assert_eq "$(wc -l <<<"$rows")" "$G" "health rows"
assert_eq "$(awk '$4 == "yes"' <<<"$rows" | wc -l)" "$G" "health rows alive 'yes'"
summary "b. health (healthy, $G alive)" "exit $HEALTH_RC"
assert_eq "$(grep -c '^  \*[0-9]*->[0-9]*' <<<"$HEALTH_OUT")" "$G" "health ring edges"
grep -q '^diagnosis: ' <<<"$HEALTH_OUT" || fail "health: no diagnosis line"
json=$(timeout --foreground -s KILL 15 "$CTL_BIN" health --rendezvous="$RDV_ADDR" \
         --job="$JOB" --json 2>&1) || fail "health --json: exit $?: $json"
python3 -c 'import json,sys; h=json.loads(sys.stdin.read());
assert h["state"] == "healthy", h["state"]
assert len(h["members"]) == int(sys.argv[1]), h["members"]
assert "summary" in h["diagnosis"], h["diagnosis"]
assert sum(1 for e in h["edges"] if e.get("ring")) == int(sys.argv[1]), h["edges"]' \
  "$G" <<<"$json" || fail "health --json did not parse as expected: $json"
watch=$(timeout --foreground -s KILL 15 "$CTL_BIN" health --rendezvous="$RDV_ADDR" \
          --job="$JOB" --watch --interval=200ms --watch_count=2 2>&1) \
  || fail "health --watch: exit $?: $watch"
assert_eq "$(grep -c '^job ' <<<"$watch")" 2 "health --watch --watch_count=2 reports"
summary "b. health --json parses, --watch --watch_count=2 prints 2" "ok"
# --count is allreduce's element count: health refuses it, naming the flag
# it means, instead of reading it as a number of reports.
out=$(timeout --foreground -s KILL 15 "$CTL_BIN" health --rendezvous="$RDV_ADDR" \
        --job="$JOB" --watch --interval=200ms --count=2 2>&1) \
  && fail "health --watch --count=2 succeeded: $out"
grep -q -- '--watch_count' <<<"$out" || fail "health --count=2: no hint at --watch_count: $out"
summary "b. health --count=2 refused (names --watch_count)" "ok"
if command -v curl >/dev/null; then
  m=$(curl -sf --max-time 5 "http://127.0.0.1:$RDV_METRICS/metrics") || fail "rendezvous /metrics"
  grep -qx "halka_ring_state{halka_job=\"$JOB\",state=\"healthy\"} 1" <<<"$m" \
    || fail "rendezvous /metrics: no healthy ring state: $m"
  assert_eq "$(grep -c '^halka_member_alive{.*} 1$' <<<"$m")" "$G" "rendezvous /metrics alive members"
  m=$(curl -sf --max-time 5 "http://127.0.0.1:$W0_METRICS/metrics") || fail "worker /metrics"
  grep -q '^halka_operations_total{halka_job="'"$JOB"'",rank="0",kind="all_reduce",algorithm="ring",outcome="ok"} [1-9]' <<<"$m" \
    || fail "worker /metrics: no ring all-reduces counted: $m"
  grep -q '^halka_edge_bytes_total{halka_job="'"$JOB"'",rank="0",peer="1",direction="sent"} [1-9]' <<<"$m" \
    || fail "worker /metrics: no bytes to rank 1"
  # The page is read whole first: `curl | grep -q` under pipefail fails when
  # grep stops reading at the match and curl gets SIGPIPE.
  page=$(curl -sf --max-time 5 "http://127.0.0.1:$RDV_METRICS/") || fail "rendezvous ring page: curl failed"
  grep -q '<svg id="ring"' <<<"$page" || fail "rendezvous ring page: no <svg id=\"ring\">"
  summary "b. /metrics (rendezvous, worker 0) and the ring page over HTTP" "ok"
fi

# ------------------------------------------------------------ c. kill a rank

log "kill test: $G x halkactl allreduce --count=$KILL_COUNT --timeout=${KILL_DEADLINE_S}s --repeat=$KILL_REPEAT --check=false"
kill_names=()
for (( r = 0; r < G; ++r )); do
  run_bg "kill.r$r" timeout --foreground -s KILL 120 "$CTL_BIN" allreduce \
    --worker="${ADDR[r]}" --count=$KILL_COUNT --dtype=float32 --op=sum \
    --timeout="${KILL_DEADLINE_S}s" --repeat=$KILL_REPEAT --check=false
  kill_names+=("kill.r$r")
done

# halkactl first builds every rank's 200 MB input (seconds on a small
# machine), so a fixed sleep does not tell whether the operation started.
# Wait until the workers' telemetry (sent with each heartbeat) shows the
# all-reduce running on every rank, then give it a moment to get going.
t0=$(now_ns)
inflight=0
while (( $(now_ns) - t0 < 60 * 1000000000 )); do
  health
  # Every rank inside the operation, or data moving somewhere (which needs
  # every rank past the opening handshake).
  if [[ "$HEALTH_RC" == 0 ]] &&
     { [[ $(health_rows | awk '$5 ~ /^all_reduce/' | wc -l) == "$G" ]] ||
       health_rows | grep -E 'all_reduce .* (reduce-scatter|all-gather) ' >/dev/null; }; then
    inflight=1; break
  fi
  for n in "${kill_names[@]}"; do
    [[ -z "$(bg_rc "$n")" ]] || fail "$n returned before rank $DEAD was killed:
$(tail -n 5 "$SYS_LOG/$n.err" "$SYS_LOG/$n.out")"
  done
  sleep 0.05
done
(( inflight )) || fail "the all-reduce never showed up as running on all ranks"
# The data phase of 200 MB lasts only a second or two here and the telemetry
# is up to one heartbeat old: kill right away (no extra sleep).
kill_ns=$(now_ns)
kill -KILL "${SYS_PID[w$DEAD]}" || fail "kill -KILL worker w$DEAD"
{ wait "${SYS_PID[w$DEAD]}"; } 2>/dev/null   # reap quietly
log "in flight after $(fmt_s "$(( (kill_ns - t0) / 1000000 ))") s (telemetry below); SIGKILLed worker w$DEAD (rank $DEAD, pid ${SYS_PID[w$DEAD]})"
health_rows | sed 's/^/    /'
wait_bg $(( KILL_DEADLINE_S + 5 + 5 )) "${kill_names[@]}"
for (( r = 0; r < G; ++r )); do
  (( r == DEAD )) && continue
  if [[ "$(bg_rc "kill.r$r")" == 0 ]]; then
    fail "kill test: all $KILL_REPEAT all-reduces finished on rank $r before the kill took effect (in-flight window missed; not a product failure):
$(cat "$SYS_LOG/kill.r$r.out")"
  fi
done

for (( r = 0; r < G; ++r )); do
  n="kill.r$r"; f="$SYS_LOG/$n"
  rc=$(bg_rc "$n")
  ms=$(( ($(bg_end_ns "$n") - kill_ns) / 1000000 ))
  err=$(grep -m1 'all_reduce failed' "$f.err" || tail -n1 "$f.err")
  if (( r == DEAD )); then
    log "rank $r (killed worker): halkactl exit $rc $(fmt_s "$ms") s after the kill: $err"
    summary "c. rank $r halkactl (its worker killed)" "$(fmt_s "$ms") s, exit $rc"
  else
    log "rank $r: halkactl exit $rc $(fmt_s "$ms") s after the kill: $err"
    summary "c. rank $r halkactl returned after kill" "$(fmt_s "$ms") s, exit $rc"
  fi
  assert_ne "$rc" 0 "kill test: halkactl on rank $r exit status"
  [[ "$rc" != 124 && "$rc" != 137 ]] ||
    fail "kill test: halkactl on rank $r was killed by timeout (hang)"
  assert_lt "$ms" $(( (KILL_DEADLINE_S + 5) * 1000 )) \
    "kill test: rank $r halkactl return time after the kill (ms)"
  if (( r != DEAD )); then
    assert_file_contains "$f.err" "all_reduce failed after" \
      "kill test: rank $r error line"
    assert_file_contains "$f.err" "rank $DEAD" \
      "kill test: rank $r error names the dead rank"
  fi
done

# ------------------------------------------------------------ d. degraded

t0=$(now_ns)
seen=0
while :; do
  health
  if [[ "$HEALTH_RC" == 2 ]] &&
     [[ -n $(health_rows | awk -v d=$DEAD '$1 == d && $4 == "NO"') ]]; then
    seen=1; break
  fi
  (( $(now_ns) - kill_ns > 10 * 1000000000 )) && break
  sleep 0.1
done
detect_ms=$(( ($(now_ns) - kill_ns) / 1000000 ))
printf '%s\n' "$HEALTH_OUT"
(( seen )) || fail "10 s after the kill, halkactl health exited $HEALTH_RC without rank $DEAD alive 'NO'"
log "health: degraded, rank $DEAD not alive, seen $(fmt_s "$detect_ms") s after the kill"
rows=$(health_rows)
assert_eq "$(wc -l <<<"$rows")" "$G" "health rows after the kill"
assert_eq "$(awk -v d=$DEAD '$1 != d && $4 == "yes"' <<<"$rows" | wc -l)" \
  $(( G - 1 )) "health rows of the surviving ranks alive 'yes'"
summary "d. health degraded, rank $DEAD NO (after kill)" \
  "$(fmt_s "$detect_ms") s, exit $HEALTH_RC"

# ------------------------------------------------------------ e. SIGTERM

for name in $(for (( r = 0; r < G; ++r )); do (( r == DEAD )) || echo "w$r"; done) rdv; do
  stop_timed "$name" TERM 10
  [[ -n "$STOP_MS" ]] || fail "$name (pid ${SYS_PID[$name]}) still running 10 s after SIGTERM"
  log "SIGTERM $name: exited $STOP_RC after $(fmt_s "$STOP_MS") s"
  summary "e. SIGTERM -> exit, $name" "$(fmt_s "$STOP_MS") s, exit $STOP_RC"
  assert_lt "$STOP_MS" 1000 "$name exit time after SIGTERM (ms)"
  assert_eq "$STOP_RC" 0 "$name exit status after SIGTERM"
done

# ------------------------------------------------------------ summary

echo
echo "== system_ring_processes: measured times =="
printf '%s\n' "${SUMMARY[@]}"
echo "PASS"
