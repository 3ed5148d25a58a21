#!/usr/bin/env bash
# halkactl bench --coll=...: for every collective, an embedded 3-worker
# cluster runs a short sweep; every row must succeed with #wrong 0, and
# busbw must be algbw times nccl-tests' factor for that collective
# (2(G-1)/G all-reduce, (G-1)/G all-gather, reduce-scatter, gather, scatter
# and all-to-all, 1 broadcast, reduce and sendrecv; rank 0 of sendrecv
# sends its whole buffer once, the root of a gather nothing, the root of a
# scatter and every rank of an all-to-all (G-1)/G of the buffer).
# Bounded: 3 sizes, 2 iterations each, 120 s per collective.
set -euo pipefail
halkactl=$1
G=3
fail() { echo "FAIL: $*" >&2; exit 1; }
for spec in allreduce:4/3 allgather:2/3 reducescatter:2/3 broadcast:1 sendrecv:1 \
            reduce:1 gather:2/3 scatter:2/3 alltoall:2/3; do
  coll=${spec%%:*}
  factor=${spec#*:}
  out=$(timeout 120 "$halkactl" bench --coll="$coll" --workers=$G --op=max \
          -b 48K -e 3M -f 8 -n 2 -w 1 --json 2>/dev/null) ||
    fail "$coll: halkactl bench exited $? (output: $out)"
  rows=$(grep -c '"coll"' <<<"$out" || true)
  (( rows == 3 )) || fail "$coll: $rows JSON rows, expected 3: $out"
  # One line per row: coll wrong algbw busbw error
  python3 - "$coll" "$factor" "$out" "$G" <<'PY' || exit 1
import json, sys
coll, out, G = sys.argv[1], sys.argv[3], int(sys.argv[4])
num, _, den = sys.argv[2].partition("/")
factor = float(num) / float(den or 1)
for line in out.splitlines():
    if not line.startswith("{"):
        continue
    row = json.loads(line)
    what = f"{coll} size {row['size']}"
    if row["error"]:
        sys.exit(f"FAIL: {what}: {row['error']}")
    if row["coll"] != coll:
        sys.exit(f"FAIL: {what}: row says coll {row['coll']}")
    if row["wrong"] != 0:
        sys.exit(f"FAIL: {what}: #wrong {row['wrong']}")
    if row["algbw_gbs"] <= 0:
        sys.exit(f"FAIL: {what}: algbw {row['algbw_gbs']}")
    ratio = row["busbw_gbs"] / row["algbw_gbs"]
    # Both are printed to 1e-6 GB/s: allow the rounding of each.
    if abs(row["busbw_gbs"] - row["algbw_gbs"] * factor) > 1e-6 * (1 + factor):
        sys.exit(f"FAIL: {what}: busbw/algbw = {ratio:.4f}, expected {factor:.4f}")
    # The ring's halves: each rank sends (G-1)/G of the buffer.
    if coll == "sendrecv" and row["bytes_sent_rank0"] != row["size"]:
        sys.exit(f"FAIL: {what}: rank 0 sent {row['bytes_sent_rank0']} B, "
                 f"expected the buffer, {row['size']}")
    if coll == "gather" and row["bytes_sent_rank0"] != 0:
        sys.exit(f"FAIL: {what}: the root sent {row['bytes_sent_rank0']} B, "
                 f"expected none")
    if coll in ("allgather", "reducescatter", "scatter", "alltoall") and \
            row["bytes_sent_rank0"] != row["size"] * (G - 1) // G:
        sys.exit(f"FAIL: {what}: rank 0 sent {row['bytes_sent_rank0']} B, "
                 f"expected (G-1)/G x {row['size']}")
    print(f"{what}: algbw {row['algbw_gbs']:.4f} GB/s, busbw {row['busbw_gbs']:.4f} "
          f"GB/s (x{ratio:.4f}), #wrong 0, rank 0 sent {row['bytes_sent_rank0']} B")
PY
done
echo "bench: every collective's rows are right, with nccl-tests' busbw factors"
