#!/usr/bin/env bash
# compare.sh — halka vs Gloo, same sizes, same world sizes, one invocation.
#
# For every world size G: `halkactl bench --workers=G` (an embedded cluster,
# G workers in one process on loopback, float32 sum, every result checked)
# and gloo_bench (G threads of one process, each with its own Gloo context
# and TCP device on loopback; Gloo's ring_chunked all-reduce by default,
# every result checked), the two run one after the other, never at once.
# Prints each side's table, then one table of busbw (GB/s, nccl-tests'
# definition: algbw · 2(G-1)/G) with the ratio halka/Gloo per cell.
#
# Both sides get the same untimed warm-up (default 20 operations per size):
# the tables are steady state, what a training loop that repeats its buckets
# sees. With 1 warm-up and 5 timed operations both sides measure mostly
# their start-up, halka's more than Gloo's (its first ~20 operations of a
# new size fault in gRPC's receive buffers; docs/performance.md, "The data
# path on loopback").
#
# Gloo comes from Debian's libgloo-dev; this script installs it when it is
# missing (as root, or with sudo) and builds gloo_bench.cc with g++.
#
# Usage: bench/compare/compare.sh [options]
#   --build DIR       halka build directory (default <repo>/build)
#   --worlds "2 4 8"  world sizes (default "2 4 8")
#   --min SIZE        smallest buffer (default 256K)
#   --max SIZE        largest buffer (default 64M); sizes go up by 4x
#   --iters N         timed iterations per size (default 30)
#   --warmup N        warm-up iterations per size (default 20)
#   --gloo-algo A     ring_chunked (default), ring, halving_doubling
#   --halka-args "…"  extra flags for halkactl bench (e.g. "--algo=ring")
#   --out DIR         also keep the raw JSON rows there
#   --halkactl PATH   this halkactl instead of BUILD/client/halkactl
#   --gloo-bench PATH a gloo_bench built beforehand (no apt, no g++: a
#                     machine without them, as bench/compare/run_on_host.sh
#                     runs it from a bundle)
#   --timeout SECS    limit for each side's run per world size (default
#                     1800); a run past it is killed and the script fails
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$ROOT/build"
WORLDS="2 4 8"
MIN=256K
MAX=64M
ITERS=30
WARMUP=20
GLOO_ALGO=ring_chunked
HALKA_ARGS=""
OUT=""
HALKACTL=""
GLOO_PREBUILT=""
RUN_TIMEOUT=1800
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD="$2"; shift 2 ;;
    --worlds) WORLDS="$2"; shift 2 ;;
    --min) MIN="$2"; shift 2 ;;
    --max) MAX="$2"; shift 2 ;;
    --iters) ITERS="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --gloo-algo) GLOO_ALGO="$2"; shift 2 ;;
    --halka-args) HALKA_ARGS="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --halkactl) HALKACTL="$2"; shift 2 ;;
    --gloo-bench) GLOO_PREBUILT="$2"; shift 2 ;;
    --timeout) RUN_TIMEOUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,37p' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

[ -n "$HALKACTL" ] || HALKACTL="$BUILD/client/halkactl"
[ -x "$HALKACTL" ] || { echo "compare.sh: no $HALKACTL; build halka first (scripts/build.sh)" >&2; exit 2; }
PYTHON=/usr/bin/python3
[ -x "$PYTHON" ] || PYTHON=python3

WORK="$(mktemp -d /tmp/halka-compare.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
if [ -n "$GLOO_PREBUILT" ]; then
  [ -x "$GLOO_PREBUILT" ] || { echo "compare.sh: no $GLOO_PREBUILT" >&2; exit 2; }
  GLOO_BENCH="$GLOO_PREBUILT"
else
  if ! dpkg-query -W -f='${Status}' libgloo-dev 2>/dev/null | grep -q "install ok installed"; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "compare.sh: installing libgloo-dev" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends libgloo-dev >&2
  fi
  GLOO_BENCH="$WORK/gloo_bench"
  g++ -O2 -std=c++20 -pthread "$ROOT/bench/compare/gloo_bench.cc" -o "$GLOO_BENCH" -lgloo
fi

echo "# $(date -u +%FT%TZ) on $(nproc) cores, $(uname -r); halka $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for g in $WORLDS; do
  echo "## G=$g halka: halkactl bench --workers=$g -b $MIN -e $MAX -f 4 -n $ITERS -w $WARMUP $HALKA_ARGS"
  # shellcheck disable=SC2086
  timeout -k 5 "$RUN_TIMEOUT" "$HALKACTL" bench --workers="$g" -b "$MIN" -e "$MAX" -f 4 \
    -n "$ITERS" -w "$WARMUP" --json $HALKA_ARGS 2>"$WORK/halka-$g.log" \
    | grep '^{' >"$WORK/halka-$g.json" || {
      echo "compare.sh: halkactl bench failed for G=$g:" >&2
      tail -20 "$WORK/halka-$g.log" >&2; exit 1; }
  echo "## G=$g gloo: gloo_bench --world=$g --algo=$GLOO_ALGO"
  timeout -k 5 "$RUN_TIMEOUT" "$GLOO_BENCH" --world="$g" --min="$MIN" --max="$MAX" \
    --factor=4 --iters="$ITERS" --warmup="$WARMUP" --algo="$GLOO_ALGO" \
    >"$WORK/gloo-$g.json" || { echo "compare.sh: gloo_bench failed for G=$g" >&2; exit 1; }
done
[ -n "$OUT" ] && { mkdir -p "$OUT"; cp "$WORK"/*.json "$OUT"/; }

"$PYTHON" - "$WORK" $WORLDS <<'PY'
import json, os, sys
work, worlds = sys.argv[1], [int(w) for w in sys.argv[2:]]

def load(name):
    rows = {}
    with open(os.path.join(work, name)) as f:
        for line in f:
            r = json.loads(line)
            rows[r["size"]] = r
    return rows

def human(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)

failed = False
for side in ("halka", "gloo"):
    print(f"\n{side}: busbw GB/s (time µs, #wrong)")
    for g in worlds:
        rows = load(f"{side}-{g}.json")
        cells = []
        for size in sorted(rows):
            r = rows[size]
            if r.get("error") or r["wrong"]:
                failed = True
            cells.append(f"{human(size)} {r['busbw_gbs']:.2f} ({r['time_us']:.0f}, {r['wrong']})"
                         + (f" ERROR {r['error']}" if r.get("error") else ""))
        print(f"  G={g}: " + " | ".join(cells))

halka_all = {g: load(f"halka-{g}.json") for g in worlds}
gloo_all = {g: load(f"gloo-{g}.json") for g in worlds}
sizes = sorted(set().union(*[set(v) for v in halka_all.values()]))
print("\nbusbw GB/s, halka / gloo (ratio)")
print("| G | " + " | ".join(human(s) for s in sizes) + " |")
print("|---|" + "---|" * len(sizes))
for g in worlds:
    cells = []
    for s in sizes:
        h, o = halka_all[g].get(s), gloo_all[g].get(s)
        if not h or not o or o["busbw_gbs"] <= 0:
            cells.append("n/a")
            continue
        cells.append(f"{h['busbw_gbs']:.2f} / {o['busbw_gbs']:.2f} ({h['busbw_gbs'] / o['busbw_gbs']:.2f}x)")
    print(f"| {g} | " + " | ".join(cells) + " |")
if failed:
    print("\ncompare.sh: some rows are wrong or failed (see the tables)", file=sys.stderr)
    sys.exit(1)
PY
