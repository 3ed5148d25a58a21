#!/usr/bin/env bash
# demo_output_test.sh [BUILD_DIR] — `halkactl demo --workers=3 2>&1` reads in
# order, and each embedded worker's log lines carry its own id and rank.
#
#   order: the start line, the workers' join lines, "# ring formed", the
#   table, "# ring health", "# stopping the embedded cluster", the workers'
#   "stopped" lines, and the verdict as the last line; no log line between
#   the table's header and "# stopping".
#   tags: rank r's "joined job local: rank r of 3" and one "stopped in"
#   line per worker are tagged [worker worker-r rank r] (the three workers
#   share one process).
# Exit: 0 pass, 1 fail.
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/system/lib.sh
source "$HERE/lib.sh"
sys_binaries "${1:-}"
sys_init

G=3
OUT=$SYS_LOG/demo.txt
timeout --foreground -s KILL 240 "$CTL_BIN" demo --workers=$G >"$OUT" 2>&1
rc=$?
[[ $rc == 0 ]] || fail "halkactl demo exited $rc: $(tail -n 20 "$OUT")"

# line LABEL ERE -> the number of the first line matching ERE (fails if none)
line() {
  local n
  n=$(grep -nE -- "$2" "$OUT" | head -n 1 | cut -d: -f1)
  [[ -n $n ]] || fail "no $1 line (/$2/) in the demo's output:
$(sed 's/^/    | /' "$OUT" | head -n 40)"
  echo "$n"
}
LOGLINE='^[IWE] [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3} \['
start=$(line start '^# halka demo: starting')
joined=$(line "join" 'joined job local: rank 0 ')
formed=$(line "ring formed" '^# ring formed')
header=$(line "table header" '#wrong$')
health=$(line "ring health" '^# ring health$')
stopping=$(line "stopping" '^# stopping the embedded cluster$')
stopped=$(line "stopped" ' stopped in [0-9]+ ms')
verdict=$(line verdict '^demo: every result matched')
total=$(wc -l <"$OUT")
order=("$start" "$joined" "$formed" "$header" "$health" "$stopping" "$stopped" "$verdict")
for (( i = 1; i < ${#order[@]}; ++i )); do
  (( order[i - 1] < order[i] )) ||
    fail "demo output out of order (start join formed header health stopping stopped verdict at lines ${order[*]})"
done
assert_eq "$verdict" "$total" "the verdict is the last line"
noise=$(sed -n "${header},${stopping}p" "$OUT" | grep -E -- "$LOGLINE")
[[ -z $noise ]] || fail "log lines between the table and '# stopping':
$noise"

for (( r = 0; r < G; ++r )); do
  tag="[worker worker-$r rank $r]"
  grep -E -- "$LOGLINE" "$OUT" | grep -F -- "joined job local: rank $r of $G" | grep -qF -- "$tag" ||
    fail "rank $r's join line is not tagged $tag: $(grep -F "joined job local: rank $r of" "$OUT")"
done
tags=$(grep -E -- ' stopped in [0-9]+ ms' "$OUT" | sed -E 's/^[IWE] [0-9:.]+ \[([^]]*)\].*/\1/' | sort | tr '\n' ',')
assert_eq "$tags" "worker worker-0 rank 0,worker worker-1 rank 1,worker worker-2 rank 2," \
  "the workers' 'stopped' lines, each tagged with its own worker"
log "demo output in order (lines ${order[*]} of $total); every worker's lines tagged with its own id and rank"
echo "PASS"
