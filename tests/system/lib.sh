# shellcheck shell=bash disable=SC2034  # globals are read by the test scripts
# Shared helpers for halka system tests: real binaries as separate processes
# on 127.0.0.1. Source it from a test script:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#   sys_init                      # temp log dir + trap cleanup EXIT INT TERM
#   port=$(free_port)
#   start_daemon rdv  "$RDV" --listen=127.0.0.1:$port
#   wait_for_line rdv "listening on" 10
#   run_bg ctl0 "$CTL" allreduce ...   # rc + exit time land in $SYS_LOG/ctl0.rc
#   wait_bg ctl0 30
#
# Every process is started in its own session (setsid) and recorded by PID;
# cleanup signals exactly those process groups, never anything by name.

# Some tests listen on namespace (non-loopback) addresses: plaintext there
# needs an explicit --insecure (common/security.h); every daemon reads it.
export HALKA_INSECURE=1

# ---------------------------------------------------------------- state

SYS_LOG=""            # temp dir with every process's .out/.err (and .rc)
SYS_FAILED=0          # set by fail(); keeps the logs
declare -A SYS_PID=() # name -> pid (a session/group leader)
SYS_NAMES=()          # names in start order

# ---------------------------------------------------------------- setup

# sys_binaries [BUILD_DIR]: sets BUILD, RDV_BIN, WORKER_BIN, CTL_BIN (default
# build dir: <repo>/build) and exits 1 naming what is missing.
sys_binaries() {
  local here b
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  BUILD=${1:-$here/../../build}
  BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "FAIL: no build dir '${1:-}'"; exit 1; }
  RDV_BIN=$BUILD/server/halka-rendezvous
  WORKER_BIN=$BUILD/worker/halka-worker
  CTL_BIN=$BUILD/client/halkactl
  for b in "$RDV_BIN" "$WORKER_BIN" "$CTL_BIN"; do
    [[ -x "$b" ]] || { echo "FAIL: missing $b"; exit 1; }
  done
}

# sys_find_command CMD... : prints the path of the first CMD found.
sys_find_command() {
  local c
  for c in "$@"; do
    command -v "$c" >/dev/null 2>&1 && { command -v "$c"; return 0; }
  done
  return 1
}

# sys_require_package PKG SECONDS CMD... : prints the path of the first CMD;
# installs Debian's PKG first if none exists (without starting any service
# it ships), within SECONDS. Exits 77 (skip) when that is impossible.
sys_require_package() {
  local pkg=$1 secs=$2 path apt_rc made_policy=0 apt_log
  shift 2
  path=$(sys_find_command "$@") && { echo "$path"; return 0; }
  if (( EUID != 0 )) || ! command -v apt-get >/dev/null 2>&1; then
    echo "SKIP: $pkg is not installed and cannot be (needs root and apt-get)" >&2
    exit 77
  fi
  echo "installing Debian's $pkg package (at most $secs s)" >&2
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    # invoke-rc.d/deb-systemd-invoke: 101 = action forbidden -> no service start
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d &&
      made_policy=1
  fi
  apt_log=$(mktemp)
  DEBIAN_FRONTEND=noninteractive timeout -k 10 "$secs" apt-get install -y \
    --no-install-recommends "$pkg" >"$apt_log" 2>&1
  apt_rc=$?
  (( made_policy )) && rm -f /usr/sbin/policy-rc.d
  if ! path=$(sys_find_command "$@"); then
    echo "SKIP: 'apt-get install $pkg' failed or timed out (exit $apt_rc):" >&2
    tail -n 5 "$apt_log" >&2
    rm -f "$apt_log"
    exit 77
  fi
  rm -f "$apt_log"
  echo "$path"
}

# sys_start_loopback_job G JOB [FLAG...]: after sys_init, starts a rendezvous
# (metrics on RDV_M) and G workers (ranks 0..G-1, metrics on WM[r]) on
# 127.0.0.1 and waits until the ring formed. FLAGs go to every worker; a
# script may define `worker_flags R` to print extra flags for rank R.
# Sets RDV_ADDR, RDV_M, ADDR[r], WM[r].
sys_start_loopback_job() {
  local g=$1 job=$2 r port rdv_port extra
  shift 2
  rdv_port=$(free_port) || fail "no free port"
  RDV_M=$(free_port) || fail "no free port"
  start_daemon rdv "$RDV_BIN" --listen="127.0.0.1:$rdv_port" --metrics_port="$RDV_M" \
    --heartbeat_interval=500ms --heartbeat_timeout=10s
  wait_for_line rdv "^halka-rendezvous listening on " 10
  RDV_ADDR="127.0.0.1:$rdv_port"
  ADDR=(); WM=()
  for (( r = 0; r < g; ++r )); do
    port=$(free_port) || fail "no free port"
    WM[r]=$(free_port) || fail "no free port"
    ADDR[r]="127.0.0.1:$port"
    extra=()
    if declare -F worker_flags >/dev/null; then
      read -r -a extra <<<"$(worker_flags "$r")"
    fi
    start_daemon "w$r" "$WORKER_BIN" --rendezvous="$RDV_ADDR" --job="$job" \
      --world_size="$g" --worker_id="w$r" --rank="$r" --listen="${ADDR[r]}" \
      --metrics_port="${WM[r]}" "$@" "${extra[@]}"
  done
  for (( r = 0; r < g; ++r )); do
    wait_for_line "w$r" "^halka-worker serving on " 10
    wait_for_line "w$r" "joined job $job: rank $r of $g" 30 "$SYS_LOG/w$r.err"
  done
}

# ---------------------------------------------------------------- basics

now_ns() { date +%s%N; }

# ms_since START_NS -> integer milliseconds elapsed
ms_since() { echo $(( ($(now_ns) - $1) / 1000000 )); }

# fmt_s MS -> "1.234" (seconds)
fmt_s() { awk -v ms="$1" 'BEGIN { printf "%.3f", ms / 1000.0 }'; }

log() { printf '[%s] %s\n' "$(date +%H:%M:%S.%3N)" "$*"; }

# fail MSG... : print what failed and exit 1 (cleanup runs from the trap).
fail() {
  SYS_FAILED=1
  printf '\nFAIL: %s\n' "$*" >&2
  exit 1
}

# ---------------------------------------------------------------- assertions

assert_eq() {  # assert_eq ACTUAL EXPECTED WHAT
  [[ "$1" == "$2" ]] || fail "$3: expected '$2', got '$1'"
}

assert_ne() {  # assert_ne ACTUAL UNEXPECTED WHAT
  [[ "$1" != "$2" ]] || fail "$3: expected anything but '$2'"
}

assert_lt() {  # assert_lt A B WHAT   (integers or decimals; A < B)
  awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }' ||
    fail "$3: expected $1 < $2"
}

assert_file_contains() {  # assert_file_contains FILE FIXED_STRING WHAT
  grep -qF -- "$2" "$1" ||
    fail "$3: '$2' not found in $(basename "$1"):
$(tail -n 20 "$1" | sed 's/^/    | /')"
}

assert_file_matches() {  # assert_file_matches FILE ERE WHAT
  grep -qE -- "$2" "$1" ||
    fail "$3: /$2/ not found in $(basename "$1"):
$(tail -n 20 "$1" | sed 's/^/    | /')"
}

# ---------------------------------------------------------------- ports

# free_port: a TCP port on 127.0.0.1 nothing listens on. Asks the kernel
# (bind to port 0) through python3; without python3, probes a range derived
# from $$ with ss. Ports already handed out by this test are never repeated.
SYS_PORTS_GIVEN=" "
free_port() {
  local p i
  for i in $(seq 1 50); do
    p=""
    if command -v python3 >/dev/null 2>&1; then
      p=$(python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()' 2>/dev/null)
    fi
    if [[ -z "$p" ]]; then
      p=$(( 20000 + ($$ * 37 + i * 101 + RANDOM) % 30000 ))
    fi
    if [[ "$SYS_PORTS_GIVEN" == *" $p "* ]]; then continue; fi
    if ss -Hltn "sport = :$p" 2>/dev/null | grep -q .; then continue; fi
    SYS_PORTS_GIVEN+="$p "
    echo "$p"
    return 0
  done
  echo "free_port: no free port found" >&2
  return 1
}

# ---------------------------------------------------------------- processes

# start_daemon NAME CMD ARGS... : start CMD in the background, in its own
# session, stdout -> $SYS_LOG/NAME.out, stderr -> $SYS_LOG/NAME.err. The
# recorded PID (SYS_PID[NAME], also echoed to NAME.pid) is CMD itself, so
# it can be signalled directly.
start_daemon() {
  local name=$1; shift
  setsid "$@" >"$SYS_LOG/$name.out" 2>"$SYS_LOG/$name.err" </dev/null &
  SYS_PID[$name]=$!
  SYS_NAMES+=("$name")
  echo "${SYS_PID[$name]}" >"$SYS_LOG/$name.pid"
}

# run_bg NAME CMD ARGS... : like start_daemon, for a command that is expected
# to finish: a wrapper runs it and writes "RC END_NS" to $SYS_LOG/NAME.rc
# when it returns (START_NS is in NAME.start). Wrap CMD in
# `timeout --foreground` if it could hang (plain `timeout` moves itself to a
# process group of its own, out of reach of cleanup's group kill); wait_bg
# bounds the wait in any case.
run_bg() {
  local name=$1; shift
  now_ns >"$SYS_LOG/$name.start"
  setsid bash -c '"${@:2}"; rc=$?; echo "$rc $(date +%s%N)" >"$1.rc.tmp";
                  mv "$1.rc.tmp" "$1.rc"' \
    _ "$SYS_LOG/$name" "$@" \
    >"$SYS_LOG/$name.out" 2>"$SYS_LOG/$name.err" </dev/null &
  SYS_PID[$name]=$!
  SYS_NAMES+=("$name")
}

# bg_rc NAME : the exit status of a finished run_bg command ("" if running)
bg_rc() { [[ -f "$SYS_LOG/$1.rc" ]] && cut -d' ' -f1 "$SYS_LOG/$1.rc"; }

# bg_end_ns NAME : when a finished run_bg command returned
bg_end_ns() { [[ -f "$SYS_LOG/$1.rc" ]] && cut -d' ' -f2 "$SYS_LOG/$1.rc"; }

# wait_bg TIMEOUT_S NAME... : wait until every named run_bg command returned;
# fails (naming the ones still running) after TIMEOUT_S seconds.
wait_bg() {
  local timeout_s=$1; shift
  local deadline=$(( $(now_ns) + timeout_s * 1000000000 ))
  local name pending
  while :; do
    pending=()
    for name in "$@"; do
      [[ -f "$SYS_LOG/$name.rc" ]] || pending+=("$name")
    done
    (( ${#pending[@]} == 0 )) && break
    if (( $(now_ns) > deadline )); then
      fail "still running after ${timeout_s}s (hang): ${pending[*]}"
    fi
    sleep 0.02
  done
  for name in "$@"; do wait "${SYS_PID[$name]}" 2>/dev/null; done
  return 0
}

# pid_alive PID : true while PID runs (a zombie counts as gone)
pid_alive() {
  local state
  state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n "$state" && "$state" != "Z" && "$state" != "X" ]]
}

# wait_exit NAME TIMEOUT_S : wait until the daemon NAME exited; prints the
# milliseconds it took (from the call) and sets WAIT_RC to its exit status.
# Returns 1 (without failing) if it is still running after TIMEOUT_S.
WAIT_RC=""
wait_exit() {
  local name=$1 timeout_s=$2 pid=${SYS_PID[$1]} t0
  t0=$(now_ns)
  while pid_alive "$pid"; do
    if (( $(now_ns) - t0 > timeout_s * 1000000000 )); then
      return 1
    fi
    sleep 0.005
  done
  local ms; ms=$(ms_since "$t0")
  wait "$pid" 2>/dev/null
  WAIT_RC=$?
  echo "$ms"
}

# stop_timed NAME SIGNAL TIMEOUT_S : send SIGNAL to daemon NAME and wait for
# it to exit. Sets STOP_MS (signal -> gone, ms) and STOP_RC; STOP_MS is empty
# if it did not exit within TIMEOUT_S (it is then left for cleanup).
STOP_MS=""; STOP_RC=""
stop_timed() {
  local name=$1 sig=$2 timeout_s=$3 pid=${SYS_PID[$1]} t0
  STOP_MS=""; STOP_RC=""
  t0=$(now_ns)
  kill -s "$sig" "$pid" 2>/dev/null || return 0
  while pid_alive "$pid"; do
    if (( $(now_ns) - t0 > timeout_s * 1000000000 )); then
      return 0
    fi
    sleep 0.002
  done
  STOP_MS=$(ms_since "$t0")
  wait "$pid" 2>/dev/null
  STOP_RC=$?
}

# wait_for_line NAME ERE TIMEOUT_S [FILE] : wait until NAME's stdout (or
# FILE) has a line matching ERE; fails early if the process died.
wait_for_line() {
  local name=$1 re=$2 timeout_s=$3 file=${4:-$SYS_LOG/$1.out}
  local pid=${SYS_PID[$name]} t0
  t0=$(now_ns)
  until grep -qE -- "$re" "$file" 2>/dev/null; do
    if [[ -n "$pid" ]] && ! pid_alive "$pid" && [[ ! -f "$SYS_LOG/$name.rc" ]]; then
      grep -qE -- "$re" "$file" 2>/dev/null && return 0
      fail "$name (pid $pid) exited before printing /$re/"
    fi
    if (( $(now_ns) - t0 > timeout_s * 1000000000 )); then
      fail "$name: no line /$re/ in $(basename "$file") within ${timeout_s}s"
    fi
    sleep 0.02
  done
}

# ---------------------------------------------------------------- cleanup

print_log_tails() {
  local f
  for f in "$SYS_LOG"/*.out "$SYS_LOG"/*.err; do
    [[ -s "$f" ]] || continue
    printf '\n----- %s (last 15 lines) -----\n' "$f" >&2
    tail -n 15 "$f" >&2
  done
}

# cleanup: kill every process group this test started (by recorded PID:
# SIGTERM, then SIGKILL after 2 s), then remove the logs unless it failed
# (or HALKA_SYSTEM_KEEP_LOGS is set).
SYS_CLEANED=0
cleanup() {
  local rc=$?
  (( SYS_CLEANED )) && return
  (( SYS_FAILED && rc == 0 )) && rc=1
  SYS_CLEANED=1
  trap - EXIT INT TERM
  local name pid left=()
  for name in "${SYS_NAMES[@]}"; do
    pid=${SYS_PID[$name]}
    if kill -0 "$pid" 2>/dev/null && pid_alive "$pid"; then
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
      left+=("$pid")
    fi
  done
  local i
  for i in $(seq 1 100); do
    local any=0
    for pid in "${left[@]}"; do pid_alive "$pid" && any=1; done
    (( any )) || break
    sleep 0.02
  done
  for pid in "${left[@]}"; do
    if pid_alive "$pid"; then
      echo "cleanup: pid $pid ignored SIGTERM for 2 s; SIGKILL" >&2
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
  done
  # Processes that are gone may still have children in their group (e.g.
  # `timeout`'s child): sweep those groups too.
  for name in "${SYS_NAMES[@]}"; do
    kill -KILL -- "-${SYS_PID[$name]}" 2>/dev/null
  done
  if [[ -n "$SYS_LOG" && -d "$SYS_LOG" ]]; then
    if (( SYS_FAILED )) || (( rc != 0 )); then
      print_log_tails
      echo "logs kept in $SYS_LOG" >&2
    elif [[ -n "${HALKA_SYSTEM_KEEP_LOGS:-}" ]]; then
      echo "logs kept in $SYS_LOG (HALKA_SYSTEM_KEEP_LOGS)" >&2
    else
      rm -rf -- "$SYS_LOG"
    fi
  fi
  exit "$rc"
}

sys_init() {
  SYS_LOG=$(mktemp -d "${TMPDIR:-/tmp}/halka-system.XXXXXX") ||
    { echo "mktemp failed" >&2; exit 1; }
  # cleanup on EXIT, INT and TERM; an interrupted run counts as failed.
  trap cleanup EXIT
  trap 'SYS_FAILED=1; echo "interrupted" >&2; cleanup' INT TERM
}
