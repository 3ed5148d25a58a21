#!/usr/bin/env bash
# prometheus_scrape_test.sh BUILD_DIR — a real Prometheus scrapes halka.
#
# Installs Debian's `prometheus` package when it is missing (its service is
# never started: the test runs the binary itself with a temporary config and
# TSDB directory on a free 127.0.0.1 port, scrape_interval 1s). A rendezvous
# and 4 workers on 127.0.0.1, each with --metrics_port, are scraped while
# ring all-reduces run; the test then asks Prometheus's HTTP API
# (/api/v1/query) for halka's series: every target up, generation 1 on the
# rendezvous and every worker, 4 members alive, the job healthy, every
# rank's all_reduce/ring/ok counter > 0 and growing with a second round,
# payload bytes on every ring edge > 0 on both ends.
#
# halka labels its series with halka_job="<halka job id>", not `job` (which
# Prometheus owns: it would rename a `job` label to exported_job unless the
# scrape set honor_labels). The scrape jobs set no honor_labels; a second
# scrape job of the rendezvous checks that halka_job arrives as it is, next
# to Prometheus's own job label, and that no exported_job appears.
#
# Exit: 0 pass, 1 fail, 77 skip (prometheus not installed and cannot be).
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/system/lib.sh
source "$HERE/lib.sh"
sys_binaries "${1:-}"
for t in curl python3; do
  command -v "$t" >/dev/null 2>&1 || { echo "FAIL: $t needed"; exit 1; }
done

# ------------------------------------------------------------ prometheus

PROM_BIN=$(sys_require_package prometheus 240 prometheus) || exit $?

sys_init

G=4
JOB="prom-scrape-$$"
COUNT=262144               # float32: 1 MiB per rank
log "logs in $SYS_LOG; $("$PROM_BIN" --version 2>&1 | head -n1)"

# ------------------------------------------------------------ halka job

sys_start_loopback_job "$G" "$JOB"
log "rendezvous $RDV_ADDR (metrics :$RDV_M), workers metrics :${WM[*]}"

# ------------------------------------------------------------ start prometheus

PROM_PORT=$(free_port) || fail "no free port"
PROM_DIR="$SYS_LOG/prometheus"
mkdir -p "$PROM_DIR/data"
{
  echo "global:"
  echo "  scrape_interval: 1s"
  echo "  scrape_timeout: 900ms"
  echo "  evaluation_interval: 1s"
  echo "scrape_configs:"
  echo "  - job_name: halka-rendezvous"
  echo "    static_configs:"
  echo "      - targets: ['127.0.0.1:$RDV_M']"
  echo "  - job_name: halka-workers"
  echo "    static_configs:"
  echo "      - targets: [$(for (( r = 0; r < G; ++r )); do
                            printf "'127.0.0.1:%s'%s" "${WM[r]}" "$( (( r < G - 1 )) && echo ,)"; done)]"
  echo "  - job_name: halka-rendezvous-default-labels"
  echo "    static_configs:"
  echo "      - targets: ['127.0.0.1:$RDV_M']"
} >"$PROM_DIR/prometheus.yml"
if command -v promtool >/dev/null 2>&1; then
  promtool check config "$PROM_DIR/prometheus.yml" >"$SYS_LOG/promtool.out" 2>&1 ||
    fail "promtool check config: $(cat "$SYS_LOG/promtool.out")"
fi
start_daemon prom "$PROM_BIN" --config.file="$PROM_DIR/prometheus.yml" \
  --storage.tsdb.path="$PROM_DIR/data" --web.listen-address="127.0.0.1:$PROM_PORT" \
  --storage.tsdb.retention.time=1h
PROM="http://127.0.0.1:$PROM_PORT"
t0=$(now_ns)
until curl -sf --max-time 2 "$PROM/-/ready" >/dev/null 2>&1; do
  pid_alive "${SYS_PID[prom]}" || fail "prometheus exited: $(tail -n 5 "$SYS_LOG/prom.err")"
  (( $(now_ns) - t0 > 30 * 1000000000 )) && fail "prometheus not ready within 30 s"
  sleep 0.2
done
log "prometheus pid ${SYS_PID[prom]} ready on $PROM after $(fmt_s "$(ms_since "$t0")") s"

# q EXPR -> prints "labels-json<TAB>value" per result sample (instant query)
q() {
  curl -sf --max-time 5 -G "$PROM/api/v1/query" --data-urlencode "query=$1" |
    python3 -c 'import json, sys
r = json.load(sys.stdin)
assert r["status"] == "success", r
for s in r["data"]["result"]:
    print(json.dumps(s["metric"], sort_keys=True) + "\t" + s["value"][1])'
}
# qv EXPR -> the value of a query that yields one sample ("" otherwise)
qv() { local o; o=$(q "$1") || return 1; [[ $(wc -l <<<"$o") == 1 && -n "$o" ]] && cut -f2 <<<"$o"; }
# wait_q EXPR WANT TIMEOUT_S WHAT : until qv EXPR == WANT
wait_q() {
  local v t0; t0=$(now_ns)
  while :; do
    v=$(qv "$1")
    [[ "$v" == "$2" ]] && return 0
    (( $(now_ns) - t0 > $3 * 1000000000 )) &&
      fail "$4: Prometheus query '$1' gave '${v}' (want $2) for ${3}s; full: $(q "$1" | head -n 10)"
    sleep 0.5
  done
}

# ------------------------------------------------------------ all-reduces

round() {  # round NAME REPEAT : ring all-reduces on every rank, concurrently
  local name=$1 repeat=$2 r names=()
  for (( r = 0; r < G; ++r )); do
    run_bg "$name.r$r" timeout --foreground -s KILL 60 "$CTL_BIN" allreduce \
      --worker="${ADDR[r]}" --algo=ring --count=$COUNT --dtype=float32 --op=sum \
      --repeat="$repeat" --timeout=30s
    names+=("$name.r$r")
  done
  wait_bg 70 "${names[@]}"
  for (( r = 0; r < G; ++r )); do
    [[ "$(bg_rc "$name.r$r")" == 0 ]] ||
      fail "$name: halkactl on rank $r exited $(bg_rc "$name.r$r"): $(tail -n 5 "$SYS_LOG/$name.r$r.err")"
    assert_eq "$(grep -cE "#wrong 0\$" "$SYS_LOG/$name.r$r.out")" "$repeat" "$name rank $r: #wrong 0 lines"
  done
}
J="halka_job=\"$JOB\""
# The rendezvous is scraped twice (the second job: default labels); its
# series are asked of the first scrape job.
RJ="$J,job=\"halka-rendezvous\""
OPS_OK="halka_operations_total{$J,kind=\"all_reduce\",algorithm=\"ring\",outcome=\"ok\"}"

t_ops=$(now_ns)
round first 5
log "first round: $G x 5 ring all-reduces of 1 MiB in $(fmt_s "$(ms_since "$t_ops")") s"

wait_q 'count(up{job=~"halka-.*"} == 1)' 6 20 "targets up"
wait_q "count($OPS_OK >= 5)" "$G" 20 "every rank's ok ring all_reduce counter scraped"
first_total=$(qv "sum($OPS_OK)")
log "after round 1: sum of ok ring all_reduce counters = $first_total"

# Second round while Prometheus keeps scraping; the counters must grow.
round second 10
wait_q "count($OPS_OK >= 15)" "$G" 20 "every rank's ok counter after round 2"
log "after round 2: sum = $(qv "sum($OPS_OK)")"
v=$(qv "sum(increase(${OPS_OK}[2m]))")
assert_lt 0 "${v:-0}" "increase() of the ok counters over 2m"

# ------------------------------------------------------------ assertions

printf '%s\n' "--- Prometheus answers (instant queries) ---"
check() {  # check WHAT EXPR WANT
  local v; v=$(qv "$2")
  printf '  %-58s %s\n' "$1" "${v:-<none>}"
  assert_eq "$v" "$3" "$1 ($2)"
}
check "rendezvous: ring generation" "halka_ring_generation{$RJ}" 1
check "rendezvous: members" "halka_ring_members{$RJ}" "$G"
check "rendezvous: members alive" "count(halka_member_alive{$RJ} == 1)" "$G"
check "rendezvous: state healthy" "halka_ring_state{$RJ,state=\"healthy\"}" 1
check "workers reporting generation 1" "count(halka_worker_generation{$J} == 1)" "$G"
check "workers: ok ring all_reduce counters > 0" "count($OPS_OK > 0)" "$G"
check "workers: failed all_reduces" "count(halka_operations_total{$J,outcome!=\"ok\"} > 0) or vector(0)" 0
check "workers: latency histogram count >= 15" "count(halka_operation_seconds_count{$J} >= 15)" "$G"
check "rendezvous: per-member ops counters > 0" "count(halka_member_operations_total{$RJ,outcome=\"ok\"} > 0)" "$G"
# Ring edge r -> r+1: bytes sent by r to peer r+1 and received by r+1 from r.
for (( r = 0; r < G; ++r )); do
  n=$(( (r + 1) % G ))
  s=$(qv "halka_edge_bytes_total{$J,rank=\"$r\",peer=\"$n\",direction=\"sent\"}")
  c=$(qv "halka_edge_bytes_total{$J,rank=\"$n\",peer=\"$r\",direction=\"received\"}")
  printf '  %-58s %s / %s\n' "edge $r->$n bytes sent / received" "${s:-<none>}" "${c:-<none>}"
  assert_lt 0 "${s:-0}" "edge $r->$n: bytes sent by rank $r"
  assert_eq "$s" "$c" "edge $r->$n: bytes sent by $r == bytes received by $n"
  # ring: 2(G-1)/G of the 4*COUNT bytes per operation, 15 operations per rank
  ops=$(qv "halka_operations_total{$J,rank=\"$r\",kind=\"all_reduce\",algorithm=\"ring\",outcome=\"ok\"}")
  assert_eq "$s" $(( ${ops%%.*} * 2 * (G - 1) * 4 * COUNT / G )) \
    "edge $r->$n: bytes sent == ok ops ($ops) x 2(G-1)/G x 4 x $COUNT"
  w=$(qv "halka_edge_window_bytes{$RJ,from=\"$r\",to=\"$n\"}")
  printf '  %-58s %s\n' "rendezvous: edge $r->$n window bytes" "${w:-<none>}"
  assert_lt 0 "${w:-0}" "rendezvous: edge $r->$n window bytes"
done
# Default labels: halka_job kept as it is, next to Prometheus's job label.
check "default scrape config: halka_job beside job" \
  "halka_ring_generation{job=\"halka-rendezvous-default-labels\",halka_job=\"$JOB\"}" 1
check "no series renamed to exported_job" "count({exported_job!=\"\"}) or vector(0)" 0

log "PASS: Prometheus scraped the rendezvous and $G workers"
echo "PASS"
