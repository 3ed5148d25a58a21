#!/usr/bin/env bash
# shm_reclaim_test.sh [BUILD_DIR] — a worker removes the /dev/shm objects of
# client processes that are gone, and never those of a live one.
#
#   a. a rendezvous and 2 workers on 127.0.0.1 (--shm_sweep_interval=1s);
#      `halkactl allreduce` on rank 0 alone blocks in its call (rank 1 never
#      calls) with its staging object /dev/shm/halka-held-<pid>-*: the
#      object outlives 8 s of sweeps (past the 5 s minimum age)
#   b. SIGKILL that halkactl: a sweep removes the object within 15 s and
#      a worker's log names it, on a line tagged with that worker's own id
#      and rank; on SIGTERM the workers' signal and "stopped" lines carry
#      their id and rank too
#   c. with the workers stopped: an object no process holds (a dead
#      creator) and one a live process holds under its flock, both older
#      than 5 s; a new worker (--shm_sweep_interval=1h) removes the first
#      at start and leaves the second
#
# Other workers on this machine sweep /dev/shm too (every minute by
# default); run it alone (CTest runs tests one at a time unless -j).
# Exit: 0 pass, 1 fail.
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/system/lib.sh
source "$HERE/lib.sh"
sys_binaries "${1:-}"
command -v python3 >/dev/null 2>&1 || { echo "FAIL: python3 needed"; exit 1; }
[[ -d /dev/shm && -w /dev/shm ]] || { echo "FAIL: /dev/shm is not writable"; exit 1; }
sys_init

JOB="shm-reclaim-$$"
SHM_OBJECTS=()   # removed at exit, whatever happened
on_exit() {
  local f
  for f in "${SHM_OBJECTS[@]}"; do rm -f -- "/dev/shm/$f"; done
  cleanup
}
trap on_exit EXIT INT TERM

# objects PID -> the names of PID's halka-held objects, one a line
objects() { (cd /dev/shm && ls -1 -- "halka-held-$1-"* 2>/dev/null); }

# ------------------------------------------------------------ a. live client
sys_start_loopback_job 2 "$JOB" --shm_sweep_interval=1s
log "rendezvous $RDV_ADDR, workers ${ADDR[*]}"
start_daemon ctl "$CTL_BIN" allreduce --worker="${ADDR[0]}" --count=262144 \
  --dtype=float32 --op=sum --timeout=120s
CTL_PID=${SYS_PID[ctl]}
t0=$(now_ns)
until [[ -n $(objects "$CTL_PID") ]]; do
  pid_alive "$CTL_PID" || fail "halkactl exited: $(tail -n 5 "$SYS_LOG/ctl.err")"
  (( $(now_ns) - t0 > 20 * 1000000000 )) && fail "no /dev/shm/halka-held-$CTL_PID-* within 20 s"
  sleep 0.1
done
mapfile -t HELD < <(objects "$CTL_PID")
SHM_OBJECTS+=("${HELD[@]}")
log "halkactl (pid $CTL_PID) holds ${HELD[*]}; waiting 8 s of sweeps"
sleep 8
pid_alive "$CTL_PID" || fail "halkactl did not stay in its call: $(tail -n 5 "$SYS_LOG/ctl.err")"
for f in "${HELD[@]}"; do
  [[ -e /dev/shm/$f ]] || fail "a sweep removed $f of the live halkactl (pid $CTL_PID)"
done
# (leftovers of other, dead clients on this machine may have been removed)
for f in "${HELD[@]}"; do
  grep -F -- "$f" "$SYS_LOG/w0.err" "$SYS_LOG/w1.err" | grep -q 'removed' &&
    fail "a worker logged the removal of $f while its halkactl was alive"
done
log "a. live client's objects kept through 8 s of 1 s sweeps"

# ------------------------------------------------------------ b. SIGKILL
kill -KILL "$CTL_PID"
t_kill=$(now_ns)
while pid_alive "$CTL_PID"; do sleep 0.01; done
for f in "${HELD[@]}"; do
  until [[ ! -e /dev/shm/$f ]]; do
    (( $(now_ns) - t_kill > 15 * 1000000000 )) &&
      fail "$f of the SIGKILLed halkactl still in /dev/shm 15 s later"
    sleep 0.1
  done
done
gone_ms=$(ms_since "$t_kill")
for f in "${HELD[@]}"; do
  grep -hE "^I [0-9:.]+ \[worker w[01] rank [01]\] removed [0-9]+ shared-memory object\(s\) .*$f" \
    "$SYS_LOG/w0.err" "$SYS_LOG/w1.err" | grep -q . ||
    fail "no worker log line names $f: $(grep -h 'removed' "$SYS_LOG"/w?.err)"
done
log "b. SIGKILLed client's objects removed $(fmt_s "$gone_ms") s after the kill"
grep -h 'removed' "$SYS_LOG"/w?.err | sed 's/^/    | /'
for r in 0 1; do
  stop_timed "w$r" TERM 10
  [[ -n $STOP_MS ]] || fail "w$r did not stop on SIGTERM within 10 s"
  # the process's own line (the signal) and the node's carry id and rank
  for what in 'signal 15: shutting down' 'stopped in '; do
    grep -F -- "$what" "$SYS_LOG/w$r.err" | grep -qF "[worker w$r rank $r] " ||
      fail "w$r's '$what' line is not tagged [worker w$r rank $r]: $(grep -F -- "$what" "$SYS_LOG/w$r.err")"
  done
done

# ------------------------------------------------------------ c. at start
DEAD_NAME="halka-held-999999999-0-$$"
LIVE_NAME="halka-held-$$-1-0"
SHM_OBJECTS+=("$DEAD_NAME" "$LIVE_NAME")
python3 -c 'import os, sys
fd = os.open("/dev/shm/" + sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.ftruncate(fd, 4096)
os.close(fd)' "$DEAD_NAME" || fail "cannot create /dev/shm/$DEAD_NAME"
start_daemon holder python3 -c 'import fcntl, os, sys, time
fd = os.open("/dev/shm/" + sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
fcntl.flock(fd, fcntl.LOCK_SH)
os.ftruncate(fd, 4096)
print("holding", flush=True)
time.sleep(120)' "$LIVE_NAME"
wait_for_line holder '^holding$' 10
sleep 5.5   # both past the minimum age
port=$(free_port) || fail "no free port"
start_daemon late "$WORKER_BIN" --rendezvous="$RDV_ADDR" --job="$JOB-late" \
  --world_size=1 --worker_id=late --listen="127.0.0.1:$port" --shm_sweep_interval=1h
wait_for_line late "removed 1 shared-memory object\(s\) .*$DEAD_NAME \(1 held by live ones\)" 10 \
  "$SYS_LOG/late.err"
[[ -e /dev/shm/$DEAD_NAME ]] && fail "$DEAD_NAME still there after the worker logged its removal"
[[ -e /dev/shm/$LIVE_NAME ]] || fail "the new worker removed $LIVE_NAME, which a live process holds"
log "c. a starting worker removed the dead creator's object, kept the held one"
echo "PASS"
