#!/usr/bin/env bash
# grpc_vs_wire.sh BUILD [options] — halka's gRPC stream path against its
# wire, beside what the same pattern costs over gRPC and over a plain socket
# without halka (halka-grpc-ring-floor), one world size after the other, in
# one run. Per G and size, µs per operation:
#   halka wire   halkactl bench --algo=ring --shm_links=false --hosts=G
#                (--algo A: that algorithm; the floor is always the ring's
#                pattern)
#   halka gRPC   the same with --wire_links=false
#   floor tcp    halka-grpc-ring-floor's plain-TCP links
#   floor gRPC   its gRPC streams (set up as halka's)
# and the ratios (speed, so >1 is faster):
#   gRPC/wire    halka's gRPC path against its wire (issue 34's criterion)
#   floor g/t    gRPC against a plain socket with nothing else in the path
#   gRPC/floor   halka's gRPC path against bare gRPC (1.0: as fast as gRPC
#                allows in this pattern)
# Options: --worlds "2 4 8" --min 256K --max 16M --iters 30 --warmup 10
#          --rounds N (every cell N times, alternating the three runs:
#          halka wire, halka gRPC, the floor; the median)
#          --algo A (halka's algorithm, default ring)
set -euo pipefail
BUILD=${1:?usage: grpc_vs_wire.sh BUILD [--worlds "2 4 8"] [--min S] [--max S] [--iters N] [--warmup N] [--rounds N] [--algo A]}
shift
WORLDS="2 4 8"; MIN=256K; MAX=16M; ITERS=30; WARMUP=10; ROUNDS=1; ALGO=ring
while [ $# -gt 0 ]; do
  case "$1" in
    --worlds) WORLDS=$2; shift 2 ;;
    --min) MIN=$2; shift 2 ;;
    --max) MAX=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --algo) ALGO=$2; shift 2 ;;
    *) echo "grpc_vs_wire.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
HALKACTL="$BUILD/client/halkactl"
FLOOR="$BUILD/bench/grpc_floor/halka-grpc-ring-floor"
for b in "$HALKACTL" "$FLOOR"; do
  [ -x "$b" ] || { echo "grpc_vs_wire.sh: $b is not built" >&2; exit 2; }
done
TMP=$(mktemp -d)
trap 'rm -rf -- "$TMP"' EXIT

# One run's rows into $TMP/NAME ("size time" for halka, "size tcp grpc" for
# the floor); on a failure (the command's, or a halka row with #wrong not
# 0) says which run and why, with the command's own output, and exits 1.
run() {  # NAME command...
  local name=$1; shift
  if ! timeout 600 "$@" > "$TMP/$name.out" 2>&1; then
    echo "grpc_vs_wire.sh: $name failed: $*" >&2
    tail -20 "$TMP/$name.out" >&2
    exit 1
  fi
  case "$name" in
    floor.*) awk '$1 ~ /^[0-9]+$/ { print $1, $2, $3 }' "$TMP/$name.out" > "$TMP/$name" ;;
    *) if ! awk '$1 ~ /^[0-9]+$/ && NF >= 9 {
                   if ($9 != 0) { print "size " $1 ": #wrong " $9 > "/dev/stderr"; bad = 1 }
                   print $1, $6 }
                 END { exit bad }' "$TMP/$name.out" > "$TMP/$name"; then
         echo "grpc_vs_wire.sh: $name: wrong results (above): $*" >&2
         exit 1
       fi ;;
  esac
}
halka() {  # NAME G extra-args...
  local name=$1 g=$2; shift 2
  run "$name" "$HALKACTL" bench --workers="$g" -b "$MIN" -e "$MAX" -f 4 \
    --n="$ITERS" --w="$WARMUP" --algo="$ALGO" --shm_links=false --hosts="$g" "$@"
}

for g in $WORLDS; do
  for (( r = 1; r <= ROUNDS; r++ )); do
    halka "wire.$g.$r" "$g"
    halka "grpc.$g.$r" "$g" --wire_links=false
    run "floor.$g.$r" "$FLOOR" --world "$g" --min "$MIN" --max "$MAX" \
      --iters "$ITERS" --warmup "$WARMUP"
  done
done

echo "µs per operation, the median of $ROUNDS round(s) of $ITERS after $WARMUP (halka: --algo=$ALGO; floor: the ring's pattern; loopback)"
echo "| G | size | halka wire | halka gRPC | floor tcp | floor gRPC | gRPC/wire | floor g/t | gRPC/floor |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
for g in $WORLDS; do
  awk -v g="$g" -v rounds="$ROUNDS" -v dir="$TMP" '
    function median(list,   n, a, i, j, t) {
      n = split(list, a, " ")
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
        if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function human(b) {
      return b >= 1048576 ? b / 1048576 "M" : b / 1024 "K"
    }
    BEGIN {
      for (r = 1; r <= rounds; r++) {
        f = dir "/wire." g "." r
        while ((getline line < f) > 0) { split(line, x, " "); w[x[1]] = w[x[1]] " " x[2]; sizes[x[1]] = 1 }
        close(f)
        f = dir "/grpc." g "." r
        while ((getline line < f) > 0) { split(line, x, " "); p[x[1]] = p[x[1]] " " x[2] }
        close(f)
        f = dir "/floor." g "." r
        while ((getline line < f) > 0) { split(line, x, " "); ft[x[1]] = ft[x[1]] " " x[2]; fg[x[1]] = fg[x[1]] " " x[3] }
        close(f)
      }
      n = 0
      for (s in sizes) order[++n] = s + 0
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
        if (order[j] < order[i]) { t = order[i]; order[i] = order[j]; order[j] = t }
      for (i = 1; i <= n; i++) {
        s = order[i]
        W = median(w[s]); P = median(p[s]); T = median(ft[s]); F = median(fg[s])
        printf "| %d | %s | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f |\n",
               g, human(s), W, P, T, F, W / P, T / F, F / P
      }
    }'
done
