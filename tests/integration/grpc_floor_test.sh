#!/usr/bin/env bash
# bench/grpc_floor/grpc_vs_wire.sh in short: every cell of the table is
# there and a number, halka's results are checked (#wrong 0 or the script
# fails), and halka-grpc-ring-floor checks every chunk it moves (sender,
# step, chunk, operation and length, or it exits 1). Then the floor alone
# with a bad flag, which must be refused with a message.
set -u
BUILD=${1:?usage: grpc_floor_test.sh BUILD}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCRIPT="$HERE/../../bench/grpc_floor/grpc_vs_wire.sh"
out=$(bash "$SCRIPT" "$BUILD" --worlds "2 3" --min 4K --max 64K --iters 3 \
        --warmup 1 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: grpc_vs_wire.sh exited $rc"; exit 1; }
rows=$(echo "$out" | grep -cE '^\| [23] \| (4K|16K|64K) \|( [0-9]+\.[0-9]+ \|){7}$')
[ "$rows" -eq 6 ] || { echo "FAIL: $rows of 6 rows (G 2 and 3, 4K 16K 64K) with every cell a number"; exit 1; }
msg=$("$BUILD/bench/grpc_floor/halka-grpc-ring-floor" --world 1 2>&1)
rc=$?
[ $rc -ne 0 ] && echo "$msg" | grep -q -- '--world' ||
  { echo "FAIL: --world 1 was not refused with a message (rc $rc: $msg)"; exit 1; }
echo PASS
