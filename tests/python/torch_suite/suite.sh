#!/bin/bash
# PyTorch's own distributed tests (the selections of SELECT below) with gloo
# and with halka, at each world size in WORLD_SIZES, in this interpreter's
# torch; fails when a test that passes with gloo does not pass with halka
# and expectations.txt does not list it (or lists a test that passes), or
# when halka skips a test for a reason that file does not list. CTest runs it as python_torch_suite; by hand:
#   PYTHONPATH=build/client/python bash tests/python/torch_suite/suite.sh
# PYTHON, WORLD_SIZES and SELECT may be set in the environment; WORLD_SIZES
# names the full passes. A pass at world size 8 runs the group tests that
# torch 2.6's harness skips below 8 (SELECT8; set it empty to leave it out).
#
# The default is CI's short form, which CTest runs on both torches (this
# machine's torch 1.13 as python_torch_suite, torch 2.6 inside
# python_torch2): torch 1 at world 4 (its harness runs the group tests
# there, so no pass at 8), torch 2 at world 3 and the group tests at 8.
# Together they run every selection at 3 and 4 ranks and the group tests
# at 8. The full form runs 3, 4 and the group tests at 8 on either torch:
#   FULL=1 PYTHONPATH=build/client/python bash tests/python/torch_suite/suite.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-/usr/bin/python3}
major=$("$py" -c 'import torch; print(torch.__version__.split(".")[0])') || {
  echo "python_torch_suite: $py cannot import torch"; exit 1; }
select8_all="all_reduce_group all_reduce_coalesced_group all_gather_group all_gather_coalesced_group barrier_group barrier_timeout_group barrier_full_group broadcast_group gather_group reduce_group scatter_group monitored_barrier"
if [ "${FULL:-0}" = 1 ]; then
  default_sizes="3 4"; default8=$select8_all
elif [ "$major" -lt 2 ]; then
  default_sizes="4"; default8=""
else
  default_sizes="3"; default8=$select8_all
fi
sizes=${WORLD_SIZES:-$default_sizes}
# Test name prefixes: the collectives, point to point (send_recv, isend,
# irecv, batch_isend_irecv), DDP, groups, monitored_barrier, get_future.
select=${SELECT:-all_reduce broadcast all_gather reduce_scatter barrier scatter gather all_to_all send_recv DistributedDataParallel new_subgroups reduce isend irecv batch_isend_irecv monitored_barrier get_future new_group}
select8=${SELECT8-$default8}
echo "python_torch_suite: torch $major, world sizes: $sizes${select8:+, and 8 for the group tests}"
out=$(mktemp -d /tmp/halka-suite.XXXXXX)
trap 'rm -rf "$out"' EXIT
rc=0
passes=()
for w in $sizes; do passes+=("$w:$select"); done
[ -n "$select8" ] && passes+=("8:$select8")
for pass in "${passes[@]}"; do
  w=${pass%%:*}
  names=${pass#*:}
  for b in gloo halka; do
    # Each test is bounded by run_suite's --timeout; the whole run by this.
    if ! timeout 1500 "$py" "$here/run_suite.py" --backend "$b" \
        --world-size "$w" --select $names --out "$out/$b-$w.json" \
        > "$out/$b-$w.log" 2>&1; then
      echo "run_suite.py --backend $b --world-size $w did not finish:"
      tail -40 "$out/$b-$w.log"
      rc=1
      continue
    fi
    tail -1 "$out/$b-$w.log"
  done
  [ -f "$out/gloo-$w.json" ] && [ -f "$out/halka-$w.json" ] || continue
  "$py" "$here/compare_suite.py" "$out/gloo-$w.json" "$out/halka-$w.json" \
    --log "$out/halka-$w.log" || rc=1
done
exit $rc
