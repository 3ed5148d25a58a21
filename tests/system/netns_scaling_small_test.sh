#!/usr/bin/env bash
# netns_scaling_small_test.sh [BUILD_DIR] — the small, fast form of
# bench/scaling/netns_scaling.sh for CI (label `system`): G = 2 and 4 hosts as
# network namespaces on a bridge, every link tbf-capped at 1gbit both ways,
# a 4 MiB float32 all-reduce with ring and naive (and ps when
# server/halka-ps is built), 2 operations each. Checks results, not times:
# passes only when every row has #wrong 0 on every rank.
#
# Exit: 0 pass, 1 fail, 77 skip (not root, or `ip netns add` does not work).

set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD=${1:-$REPO/build}
BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "FAIL: no build dir '${1:-}'"; exit 1; }
SCRIPT="$REPO/bench/scaling/netns_scaling.sh"

skip() { echo "SKIP: needs root and ip netns ($*)"; exit 77; }
(( EUID == 0 )) || skip "not root"
command -v ip >/dev/null 2>&1 || skip "no ip command"
command -v tc >/dev/null 2>&1 || skip "no tc command"
probe="hsp$$"
ip netns add "$probe" >/dev/null 2>&1 || skip "'ip netns add' failed"
ip netns del "$probe" >/dev/null 2>&1
probe_l="hsp$$-a"
if ! ip link add "$probe_l" type veth peer name "hsp$$-b" >/dev/null 2>&1; then
  skip "cannot create a veth pair"
fi
ip link del "$probe_l" >/dev/null 2>&1

for b in server/halka-rendezvous worker/halka-worker client/halkactl; do
  [[ -x "$BUILD/$b" ]] || { echo "FAIL: missing $BUILD/$b"; exit 1; }
done

ALGOS="ring naive"
if [[ -x "$BUILD/server/halka-ps" ]]; then
  ALGOS="ring naive ps"
else
  echo "ps: skipped (halka-ps not built)"
fi

OUT=$(mktemp -d "${TMPDIR:-/tmp}/halka-netns-small.XXXXXX") || { echo "FAIL: mktemp"; exit 1; }
child=""
on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  # netns_scaling.sh cleans up its own namespaces; make sure it has ended.
  if [[ -n "$child" ]] && kill -0 "$child" 2>/dev/null; then
    kill -TERM "$child" 2>/dev/null
    for _ in $(seq 1 150); do kill -0 "$child" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$child" 2>/dev/null
  fi
  if (( rc == 0 )); then rm -rf -- "$OUT"; else echo "results and logs kept in $OUT"; fi
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start=$(date +%s)
# Bounded twice: --max-seconds inside, timeout outside (ctest's TIMEOUT 600).
timeout -k 20 540 bash "$SCRIPT" --build "$BUILD" --worlds "2 4" --sizes-mib 4 \
  --algos "$ALGOS" --rate 1gbit --repeats 2 --op-timeout 60 --max-seconds 480 \
  --plot no --out "$OUT" &
child=$!
wait "$child"
rc=$?
child=""
echo "netns_scaling.sh exited $rc after $(( $(date +%s) - start )) s"

# Every expected row must be there and OK.
fail=0
for g in 2 4; do
  for a in $ALGOS; do
    row=$(awk -F, -v g="$g" -v a="$a" '$1 == 4 && $2 == g && $3 == a' "$OUT/results.csv" 2>/dev/null)
    st=$(cut -d, -f4 <<<"$row")
    if [[ "$st" != OK ]]; then
      echo "FAIL: G=$g $a: ${st:-no row} ${row:+($row)}"
      fail=1
    fi
  done
done
# And every rank's every operation reported #wrong 0.
if [[ -f "$OUT/ops.csv" ]]; then
  bad=$(awk -F, 'NR > 1 && $10 != "0"' "$OUT/ops.csv")
  [[ -z "$bad" ]] || { echo "FAIL: operations with wrong elements:"; echo "$bad"; fail=1; }
else
  echo "FAIL: no ops.csv"; fail=1
fi
(( rc == 0 )) || fail=1
if (( fail )); then
  echo "FAIL: netns scaling (small)"
  exit 1
fi
echo "PASS: netns scaling (small): every row #wrong 0 on every rank"
exit 0
