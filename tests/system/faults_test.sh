#!/usr/bin/env bash
# faults_test.sh BUILD_DIR [--full] [SCENARIO...] — fault injection on real
# processes in network namespaces (198.18.77.0/24 on one bridge): a
# rendezvous, 4 workers and a driver host, each a namespace of its own.
#
# halka-fault-driver runs all-reduces on every worker, one operation at a
# time (int64 sums whose result proves which ranks and which operation it
# came from), while a fault is injected; fault_report.py then checks:
# no wrong result, no hang; every survivor call in flight at the fault
# returned within the bound (heartbeat timeout + interval + 1.5 s; more for
# a peer that stops reading, see lose_and_heal) with an error naming the
# lost peer; an operation on the smaller ring succeeded;
# after the fault is lifted, an operation on all 4 ranks succeeded.
#
# Scenarios (all by default; name some to run only those):
#   sigkill     SIGKILL a worker mid all-reduce (elastic 2..4), restart it
#   sigstop     SIGSTOP a worker for 4 s, then SIGCONT
#   linkdown    `ip link set eth0 down` on a worker for 10 s, then up
#   loss        iptables statistic: drop 15% of one worker's packets
#   tbf         one worker's egress throttled to 20mbit with tc tbf: slow
#               but correct, then short deadlines: clear DEADLINE errors
#   partition   the rendezvous cut off from every worker for 4 s: the ring
#               goes on, no operation fails
#   rdvrestart  SIGKILL the rendezvous mid-run and start a new one: the
#               workers re-register, the job goes on at its generation
#   hostloss_hosts
#               a whole host lost: both workers of one of 2 hosts of 2
#               SIGKILLed at once, the other host's two go on as a flat
#               ring of 2, both restarted: two_level again
#   linkdown_hosts, loss_hosts, tbf_hosts
#               linkdown, loss and tbf with the 4 workers as 2 hosts of 2
#               (--host_id), the driver asking for auto: two_level while
#               every host is whole (and the victim's link up), the flat
#               ring of 3 while it is down; the same checks, and correct
#               two_level operations (after the heal too, for linkdown)
#   sigkill_hosts, sigstop_hosts
#               sigkill and sigstop with the 4 workers as 2 hosts of 2
#               (--host_id) and the driver asking for auto: two_level
#               (16 MiB) while both hosts are whole, the flat ring of 3
#               while the victim is out; the same checks, and at least one
#               correct two_level operation, after the heal too
#   chaos_hosts the chaos scenario with the 4 workers as 2 hosts of 2
#               (--host_id): auto runs two_level while both hosts are
#               whole (512 KiB buffers, above eager_bytes) and the flat
#               ring while a worker is down, so the hierarchy is rebuilt
#               at every generation; the same checks, and at least one
#               correct two_level operation
#   chaos       200 all-reduces (1000 with --full) while random workers are
#               SIGKILLed and restarted, and in 10% of the operations
#               (CHAOS_BAD_CALLS=share to change) one random member makes a
#               bad call instead of its good one: bad dtype or kind, short
#               or overlong inline upload, abandoned upload, bad shm name
#               (issue 13). No wrong result, no hang, and no numbering split:
#               the operation after a bad call never fails on every member
#               with "already started operation #N while this rank waits in
#               #M". Prints the counts.
#
# FAULT_WORKER_FLAGS (environment): more flags for every worker (e.g.
# "--wire_tap=false", to compare).
#
# Exit: 0 pass, 1 fail, 77 skip (not root, no netns/veth/bridge).
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/system/lib.sh
source "$HERE/lib.sh"
# shellcheck source=tests/system/netns.sh
source "$HERE/netns.sh"
sys_binaries "${1:-}"
shift || true
FULL=0
SCENARIOS=()
for a in "$@"; do
  case "$a" in
    --full) FULL=1 ;;
    *) SCENARIOS+=("$a") ;;
  esac
done
(( ${#SCENARIOS[@]} )) || SCENARIOS=(sigkill sigstop linkdown loss tbf partition rdvrestart chaos chaos_hosts sigkill_hosts sigstop_hosts hostloss_hosts linkdown_hosts loss_hosts tbf_hosts)
DRIVER=$BUILD/tests/halka-fault-driver
REPORT=$HERE/fault_report.py
[[ -x "$DRIVER" ]] || { echo "FAIL: missing $DRIVER"; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "FAIL: python3 is needed"; exit 1; }

G=4
HOSTS_OF_TWO=0  # 1: workers w0,w1 say --host_id=h0, w2,w3 h1
P="ft$$-"
NET=198.18.77
ADDR_RDV=$NET.2
ADDR_DRV=$NET.3
RDV="$ADDR_RDV:7100"
addr_worker() { echo "$NET.$(( 10 + $1 ))"; }
HB=300ms
HB_TIMEOUT=1500ms
BOUND_MS=$(( 1500 + 300 + 1500 ))   # detection bound: timeout + interval + 1.5 s
RESULTS=()

sys_init
netns_switch
command -v tc >/dev/null 2>&1 || netns_skip "no tc command"
netns_add_host r "$ADDR_RDV" || netns_skip "cannot build host ${P}r (veth into a namespace)"
netns_add_host d "$ADDR_DRV" || fail "cannot build host ${P}d"
for (( r = 0; r < G; ++r )); do
  netns_add_host "w$r" "$(addr_worker "$r")" || fail "cannot build host ${P}w$r"
done
log "hosts on br0 in $SW: rendezvous $ADDR_RDV, driver $ADDR_DRV, workers $(addr_worker 0)..$(addr_worker $(( G - 1 ))); logs in $SYS_LOG"

now_ms() { date +%s%3N; }
SEQ=0
declare -a WNAME
RNAME=""
JOB=""
MODE_FLAGS=()

start_rdv() {  # start_rdv [HEARTBEAT_TIMEOUT]
  SEQ=$(( SEQ + 1 ))
  RNAME="rdv.$SEQ"
  start_daemon "$RNAME" ip netns exec "${P}r" "$RDV_BIN" --listen="$RDV" \
    --heartbeat_interval=$HB --heartbeat_timeout="${1:-$HB_TIMEOUT}" \
    --elastic_settle=300ms
  wait_for_line "$RNAME" "^halka-rendezvous listening on " 15
}

start_worker() {  # start_worker R
  local r=$1
  SEQ=$(( SEQ + 1 ))
  WNAME[r]="w$r.$SEQ"
  local host=()
  (( HOSTS_OF_TWO )) && host=(--host_id="h$(( r / 2 ))")
  start_daemon "${WNAME[r]}" ip netns exec "${P}w$r" "$WORKER_BIN" --rendezvous="$RDV" \
    --job="$JOB" --worker_id="w$r" --listen="$(addr_worker "$r"):7000" \
    --op_timeout=10s --join_timeout=60s "${MODE_FLAGS[@]}" "${host[@]}" \
    ${FAULT_WORKER_FLAGS:-}
}

wait_joined() {  # wait_joined R
  wait_for_line "${WNAME[$1]}" "joined job $JOB: rank " 30 "$SYS_LOG/${WNAME[$1]}.err"
}

# new_job NAME elastic|fixed [HEARTBEAT_TIMEOUT] : a fresh rendezvous and 4
# workers
new_job() {
  JOB="ft-$1-$$"
  if [[ "$2" == elastic ]]; then
    MODE_FLAGS=(--min_world_size=2 --max_world_size=$G)
  else
    MODE_FLAGS=(--world_size=$G)
  fi
  start_rdv "${3:-}"
  for (( r = 0; r < G; ++r )); do start_worker "$r"; done
  for (( r = 0; r < G; ++r )); do wait_joined "$r"; done
  log "[$1] job $JOB ($2) formed"
}

end_job() {  # stops this scenario's daemons (clean TERM)
  local name pid
  for name in "$RNAME" "${WNAME[@]}"; do
    pid=${SYS_PID[$name]:-}
    [[ -n "$pid" ]] || continue
    kill -CONT "$pid" 2>/dev/null
    pid_alive "$pid" && kill -TERM "$pid" 2>/dev/null
  done
  for name in "$RNAME" "${WNAME[@]}"; do
    [[ -n "${SYS_PID[$name]:-}" ]] && wait_exit "$name" 5 >/dev/null 2>&1
  done
}

DNAME=""
start_driver() {  # start_driver OPS COUNT [FLAG...]
  local ops=$1 count=$2 workers="" r
  shift 2
  for (( r = 0; r < G; ++r )); do workers+="$r=$(addr_worker "$r"):7000,"; done
  SEQ=$(( SEQ + 1 ))
  DNAME="drv.$SEQ"
  run_bg "$DNAME" ip netns exec "${P}d" timeout --foreground -s KILL 900 "$DRIVER" \
    --workers="$workers" --ops="$ops" --count="$count" --timeout=5s \
    --stop_file="$SYS_LOG/$DNAME.stop" --limit=10m "$@"
}

stop_driver() {
  touch "$SYS_LOG/$DNAME.stop"
  wait_bg 120 "$DNAME"
  local rc
  rc=$(bg_rc "$DNAME")
  [[ "$rc" == 0 ]] || log "driver exited $rc: $(tail -n 3 "$SYS_LOG/$DNAME.out")"
  grep '^RESULT' "$SYS_LOG/$DNAME.out" | tail -n 1
}

# wait_ready SINCE_MS WORLD NEED TIMEOUT_S : NEED ops correct on WORLD ranks
wait_ready() {
  local since=$1 world=$2 need=$3 t=$4 deadline
  deadline=$(( $(now_ns) + t * 1000000000 ))
  until python3 "$REPORT" ready "$SYS_LOG/$DNAME.out" --since "$since" \
      --world "$world" --need "$need"; do
    if [[ -f "$SYS_LOG/$DNAME.rc" ]]; then
      log "driver ended early: $(tail -n 3 "$SYS_LOG/$DNAME.out")"
      return 1
    fi
    (( $(now_ns) > deadline )) && { log "not $need ops on $world ranks within ${t}s"; return 1; }
    sleep 0.1
  done
}

check() {  # check ARGS... : fault_report.py check on this driver's output
  local out rc
  out=$(python3 "$REPORT" check "$SYS_LOG/$DNAME.out" --slots $G "$@")
  rc=$?
  printf '%s\n' "$out"
  RESULTS+=("$(head -n 1 <<<"$out")")
  (( rc == 0 )) || { SYS_FAILED=1; log "scenario failed: $(tail -n +2 <<<"$out")"; }
}

# ------------------------------------------------------------ scenarios

# A worker that dies (or freezes, or drops off the network) in the middle
# of a 16 MiB ring all-reduce, then comes back.
#   lose_and_heal NAME VICTIM_RANK INJECT_CMD HEAL_CMD HOLD_S [EXTRA_MS [ALGO]]
# VICTIM_RANK may list several, comma-separated (a host lost with its
# workers): the survivors go on as a ring of G minus that many.
# EXTRA_MS widens the bound for a survivor that was writing to the victim
# when it went silent: its last frames point into the caller's buffer, and
# the call returns only once gRPC lets go of them (the connection fails:
# TCP_USER_TIMEOUT = the 5 s keepalive timeout; or the peer reads again).
# ALGO: what the driver asks for (ring; auto on hosts of two runs
# two_level while both hosts are whole, and at least one such call must be
# correct).
lose_and_heal() {
  local name=$1 v=$2 inject=$3 heal=$4 hold=$5 extra=${6:-0} algo=${7:-ring} t_fault t_heal
  local who="" x lost=0
  for x in ${v//,/ }; do who+="${who:+,}w$x"; lost=$(( lost + 1 )); done
  new_job "$name" elastic
  start_driver 100000 $(( 2 * 1024 * 1024 )) --algorithm="$algo"
  wait_ready 0 $G 3 60 || fail "[$name] no correct operations before the fault"
  t_fault=$(now_ms)
  eval "$inject"
  log "[$name] injected on $who: $inject"
  # Hold the fault for HOLD_S: the survivors go on as a ring of G-1.
  while (( $(now_ms) - t_fault < hold * 1000 )); do sleep 0.1; done
  t_heal=$(now_ms)
  eval "$heal"
  log "[$name] healed: $heal"
  wait_ready "$t_heal" $G 2 60 || log "[$name] $who did not come back into the ring"
  stop_driver >/dev/null
  check --name "$name" --fault "$t_fault" --victim "$who" --victim-slot "$v" \
    --bound $(( BOUND_MS + extra )) --world-after $(( G - lost )) --heal "$t_heal"
  # Correct two_level calls in all, and after the heal (the hierarchy
  # rebuilt for the new generation).
  (( HOSTS_OF_TWO )) && require_two_level "$name" "$t_heal"
  end_job
}

# require_two_level NAME [SINCE_MS] — on 2 hosts of 2 (HOSTS_OF_TWO=1):
# fails the scenario unless the last driver ran correct two_level calls,
# and (SINCE_MS) some of them at or after SINCE_MS.
require_two_level() {
  local name=$1 since=${2:-} two_level after
  two_level=$(grep -c '^call .* outcome=ok .* algo=two_level msg=' "$SYS_LOG/$DNAME.out")
  after=$(awk -v t="${since:-0}" '/^call .* outcome=ok .* algo=two_level msg=/ {
      for (i = 1; i <= NF; ++i) if ($i ~ /^t_ms=/ && substr($i, 6) + 0 >= t) ++n
    } END { print n + 0 }' "$SYS_LOG/$DNAME.out")
  log "[$name] correct two_level calls: $two_level${since:+, $after of them after the heal}"
  if (( two_level == 0 || after == 0 )); then
    SYS_FAILED=1
    log "[$name] no operation ran two_level$( (( two_level )) && echo " after the heal")"
    RESULTS+=("SCENARIO $name: FAILED: no correct two_level call$( (( two_level )) && echo " after the heal") (the hierarchical path was not exercised)")
  fi
}

scenario_sigkill() {
  lose_and_heal sigkill 2 'kill -KILL "${SYS_PID[${WNAME[2]}]}"' \
    'start_worker 2; wait_joined 2' 3
}

scenario_sigstop() {
  lose_and_heal sigstop 1 'kill -STOP "${SYS_PID[${WNAME[1]}]}"' \
    'kill -CONT "${SYS_PID[${WNAME[1]}]}"' 6 6000
}

scenario_linkdown() {
  # The survivors' in-flight calls may take ~5.5 s to return here (their
  # frames to the unreachable peer hold the caller's zero-copy buffer until
  # gRPC gives up on the connection; the bound allows 8.3 s), so the fault
  # is held for 10 s: long enough that the ring of 3 must then run correct
  # operations before the heal, which the check requires. (Held 6 s, that
  # requirement raced the return: one CI run in several lost it.)
  lose_and_heal linkdown 3 'ip -n "${P}w3" link set eth0 down' \
    'ip -n "${P}w3" link set eth0 up' 10 5000
}

scenario_loss() {  # scenario_loss [NAME]
  local name=${1:-loss} ipt t0
  ipt=$(sys_require_package iptables 300 iptables) || return 0
  # Lost packets also delay heartbeats (TCP retransmits): with the 1.5 s
  # timeout of the other scenarios the rendezvous may declare the lossy
  # worker lost (a clear error on every call); 5 s (the default) keeps it in.
  new_job "$name" fixed 5s
  start_driver 6 $(( 128 * 1024 ))
  wait_bg 120 "$DNAME"
  cp "$SYS_LOG/$DNAME.out" "$SYS_LOG/$name.baseline"
  check --name "$name-baseline" --max-errors 0
  for chain in INPUT OUTPUT; do
    ip netns exec "${P}w1" "$ipt" -A "$chain" -m statistic --mode random \
      --probability 0.15 -j DROP || fail "[$name] iptables statistic failed"
  done
  log "[$name] w1 drops 15% of its packets both ways"
  t0=$(now_ms)
  # Slow but correct is the claim, not a time: TCP's retransmission
  # backoff (200 ms doubling) stalls a segment dropped 4-5 times running
  # for 3-6 s, which a 5 s deadline turned into errors in some runs (on
  # two hosts of two: 1 of 3 runs at 7a8fb60, 3 of 5 at c7a8279). Each
  # call gets 30 s here.
  start_driver 6 $(( 128 * 1024 )) --timeout=30s
  wait_bg 240 "$DNAME"
  for chain in INPUT OUTPUT; do ip netns exec "${P}w1" "$ipt" -F "$chain"; done
  log "[$name] 6 ops in $(( $(now_ms) - t0 )) ms under 15% loss"
  check --name "$name-15%"
  (( HOSTS_OF_TWO )) && require_two_level "$name"
  end_job
}

scenario_tbf() {  # scenario_tbf [NAME]
  local name=${1:-tbf}
  new_job "$name" fixed
  ip netns exec "${P}w2" tc qdisc replace dev eth0 root tbf rate 20mbit \
    burst 32kb latency 400ms || { log "[$name] tc tbf does not work here: skipped"; end_job; return 0; }
  start_driver 3 $(( 256 * 1024 ))
  wait_bg 240 "$DNAME"
  check --name "$name-20mbit-slow-but-correct" --max-errors 0
  (( HOSTS_OF_TWO )) && require_two_level "$name"
  start_driver 2 $(( 2 * 1024 * 1024 )) --timeout=2s
  wait_bg 240 "$DNAME"
  check --name "$name-20mbit-deadline-2s" --deadline-names w2
  ip netns exec "${P}w2" tc qdisc del dev eth0 root 2>/dev/null
  end_job
}

scenario_partition() {
  local ipt t_fault t_heal gen_before
  ipt=$(sys_require_package iptables 300 iptables) || return 0
  new_job partition elastic
  start_driver 100000 $(( 2 * 1024 * 1024 )) --algorithm=ring
  wait_ready 0 $G 3 60 || fail "[partition] no correct operations before"
  t_fault=$(now_ms)
  for chain in INPUT OUTPUT; do ip netns exec "${P}r" "$ipt" -A "$chain" -j DROP; done
  log "[partition] the rendezvous is cut off from every worker"
  sleep 4
  for chain in INPUT OUTPUT; do ip netns exec "${P}r" "$ipt" -F "$chain"; done
  t_heal=$(now_ms)
  log "[partition] healed after $(( t_heal - t_fault )) ms"
  wait_ready "$t_heal" $G 3 30 || log "[partition] no operations after the heal"
  stop_driver >/dev/null
  # Operations during the partition: all correct, on the same generation.
  python3 "$REPORT" ready "$SYS_LOG/$DNAME.out" --since "$t_fault" --world $G --need 3 ||
    { SYS_FAILED=1; log "[partition] fewer than 3 operations succeeded across the partition"; }
  check --name "partition-rendezvous-4s" --max-errors 0
  gens=$(grep -o 'outcome=ok gen=[0-9]*' "$SYS_LOG/$DNAME.out" | sort -u | wc -l)
  assert_eq "$gens" 1 "[partition] generations seen by successful operations"
  end_job
}

scenario_rdvrestart() {
  local t_fault t_heal
  new_job rdvrestart elastic
  start_driver 100000 $(( 1024 * 1024 )) --algorithm=ring
  wait_ready 0 $G 3 60 || fail "[rdvrestart] no correct operations before"
  t_fault=$(now_ms)
  kill -KILL "${SYS_PID[$RNAME]}"
  log "[rdvrestart] rendezvous SIGKILLed"
  sleep 1
  start_rdv
  t_heal=$(now_ms)
  log "[rdvrestart] a new rendezvous listens"
  wait_ready "$t_heal" $G 3 30 || log "[rdvrestart] no operations after the restart"
  # The workers re-register with their ring: the job is back, same members.
  local deadline=$(( $(now_ns) + 15 * 1000000000 )) h=""
  while :; do
    h=$(ip netns exec "${P}r" timeout --foreground -s KILL 10 "$CTL_BIN" health \
          --rendezvous="$RDV" --job="$JOB" 2>&1) && grep -q "generation" <<<"$h" && break
    (( $(now_ns) > deadline )) && break
    sleep 0.2
  done
  log "[rdvrestart] health after the restart: $(grep -m1 -i 'generation' <<<"$h")"
  grep -q "restored" "$SYS_LOG/$RNAME.err" ||
    { SYS_FAILED=1; log "[rdvrestart] the new rendezvous did not restore the job"; }
  stop_driver >/dev/null
  check --name "rendezvous-restart" --max-errors 0
  end_job
}

scenario_chaos() {  # scenario_chaos [NAME]
  local name=${1:-chaos}
  local ops=200 count=$(( 64 * 1024 )) r victim t_end down=() alive
  (( FULL )) && { ops=1000; count=$(( 1024 * 1024 )); }
  new_job "$name" elastic
  start_driver "$ops" "$count" --bad_calls="${CHAOS_BAD_CALLS:-0.1}"
  local kills=0 restarts=0 deadline=$(( $(now_ns) + 600 * 1000000000 ))
  declare -A dead_since=()
  while [[ ! -f "$SYS_LOG/$DNAME.rc" ]] && (( $(now_ns) < deadline )); do
    sleep "0.$(( RANDOM % 7 + 3 ))"
    # Restart the ones that have been down for a second or more.
    for r in "${!dead_since[@]}"; do
      if (( $(now_ms) - dead_since[$r] > 1000 + RANDOM % 1000 )); then
        start_worker "$r"; restarts=$(( restarts + 1 )); unset "dead_since[$r]"
      fi
    done
    alive=$(( G - ${#dead_since[@]} ))
    if (( alive > 2 && RANDOM % 3 == 0 )); then
      victim=$(( RANDOM % G ))
      [[ -n "${dead_since[$victim]:-}" ]] && continue
      kill -KILL "${SYS_PID[${WNAME[victim]}]}" 2>/dev/null
      dead_since[$victim]=$(now_ms)
      kills=$(( kills + 1 ))
    fi
  done
  for r in "${!dead_since[@]}"; do start_worker "$r"; restarts=$(( restarts + 1 )); done
  wait_bg 120 "$DNAME"
  local chaos_log="$SYS_LOG/$DNAME.out"
  log "[$name] $kills SIGKILLs, $restarts restarts during $(grep -c '^call' "$SYS_LOG/$DNAME.out") calls"
  log "[$name] $(grep '^RESULT' "$SYS_LOG/$DNAME.out")"
  # After the chaos: the whole ring recovers and is correct.
  t_end=$(now_ms)
  start_driver 100000 "$count"
  wait_ready "$t_end" $G 3 60 || { SYS_FAILED=1; log "[$name] the ring did not recover to $G ranks"; }
  stop_driver >/dev/null
  check --name "$name-after" --heal "$t_end"
  # The chaos run itself: no wrong result, no hang (errors are expected).
  out=$(python3 "$REPORT" check "$chaos_log" --slots $G --name "$name-$ops-ops")
  rc=$?
  printf '%s\n' "$out"
  local faults split
  faults=$(grep -o '^RESULT .* faults=[0-9]*' "$chaos_log" | grep -o '[0-9]*$')
  split=$(grep -o '^RESULT .* split=[0-9]*' "$chaos_log" | grep -o '[0-9]*$')
  local algos
  algos=$(sed -n 's/^call .* outcome=ok .* algo=\([a-z_]*\) msg=.*/\1/p' "$chaos_log" |
    sort | uniq -c | awk '{printf "%s%s %s", sep, $2, $1; sep=", "}')
  log "[$name] correct calls by algorithm: ${algos:-none}"
  RESULTS+=("$(head -n 1 <<<"$out") ($kills kills, $restarts restarts, ${faults:-?} bad calls, split ${split:-?}; ok calls: ${algos:-none})")
  (( rc == 0 )) || SYS_FAILED=1
  if (( HOSTS_OF_TWO )) && ! grep -q '^call .* outcome=ok .* algo=two_level msg=' "$chaos_log"; then
    SYS_FAILED=1
    log "[$name] no operation ran two_level: the hierarchical path was not exercised"
  fi
  end_job
}

# The same faults on 2 hosts of 2 workers (by --host_id), the driver
# asking for auto: two-level while both hosts are whole, the flat ring
# while one is short. `local` is seen by start_worker through bash's
# dynamic scope, and gone on return.
scenario_sigkill_hosts() {
  local HOSTS_OF_TWO=1
  lose_and_heal sigkill_hosts 2 'kill -KILL "${SYS_PID[${WNAME[2]}]}"' \
    'start_worker 2; wait_joined 2' 3 0 auto
}

# A whole host lost: both workers of h1 SIGKILLed at once. The two on h0
# go on as a flat ring of 2 (one host: no two-level), then both are
# restarted and the hierarchy is rebuilt for the new generation.
scenario_hostloss_hosts() {
  local HOSTS_OF_TWO=1
  lose_and_heal hostloss_hosts 2,3 \
    'kill -KILL "${SYS_PID[${WNAME[2]}]}" "${SYS_PID[${WNAME[3]}]}"' \
    'start_worker 2; start_worker 3; wait_joined 2; wait_joined 3' 3 0 auto
}

scenario_sigstop_hosts() {
  local HOSTS_OF_TWO=1
  lose_and_heal sigstop_hosts 1 'kill -STOP "${SYS_PID[${WNAME[1]}]}"' \
    'kill -CONT "${SYS_PID[${WNAME[1]}]}"' 6 6000 auto
}

# Link down, loss and tbf on 2 hosts of 2 (by --host_id): two-level
# while the victim is in the ring (auto, buffers above eager_bytes), the
# flat ring of 3 while its link is down.
scenario_linkdown_hosts() {
  local HOSTS_OF_TWO=1
  lose_and_heal linkdown_hosts 3 'ip -n "${P}w3" link set eth0 down' \
    'ip -n "${P}w3" link set eth0 up' 10 5000 auto
}

scenario_loss_hosts() {
  local HOSTS_OF_TWO=1
  scenario_loss loss_hosts
}

scenario_tbf_hosts() {
  local HOSTS_OF_TWO=1
  scenario_tbf tbf_hosts
}

# The same chaos on 2 hosts of 2 workers (by --host_id): two-level while
# both hosts are whole, the flat ring while one is short.
scenario_chaos_hosts() {
  # Seen by start_worker through bash's dynamic scope, and gone on return.
  local HOSTS_OF_TWO=1
  scenario_chaos chaos_hosts
}

for s in "${SCENARIOS[@]}"; do
  declare -F "scenario_$s" >/dev/null || fail "no scenario '$s'"
  log "=== $s"
  "scenario_$s"
done

echo
echo "== fault-injection summary (heartbeat $HB, timeout $HB_TIMEOUT, bound $(( BOUND_MS ))ms)"
for l in "${RESULTS[@]}"; do echo "$l"; done
(( SYS_FAILED )) && exit 1
exit 0
