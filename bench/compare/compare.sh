#!/usr/bin/env bash
# compare.sh — halka vs Gloo vs Open MPI, same sizes, same world sizes, one
# invocation.
#
# For every world size G, one after the other, never at once:
#   halka      `halkactl bench --workers=G` (an embedded cluster, G workers
#              in one process on loopback, float32 sum, every result
#              checked; --halka-args "--shm_links=false" for TCP links,
#              else same-host shared memory, halka's default)
#   gloo       gloo_bench (G threads of one process, each with its own Gloo
#              context and TCP device on loopback; Gloo's ring_chunked
#              all-reduce by default, every result checked)
#   mpi-tcp    mpi_bench under `mpirun -np G --mca pml ob1 --mca btl
#              tcp,self --mca btl_tcp_if_include lo` (G processes, Open
#              MPI's TCP transport on loopback; MPI_Allreduce with Open
#              MPI's own default algorithm choice, every result checked)
#   mpi-vader  the same with `--mca btl vader,self` (Open MPI's same-host
#              shared-memory transport)
# Prints each side's table, then one side-by-side table: per G and size the
# busbw (GB/s, nccl-tests' definition: algbw · 2(G-1)/G for all-reduce,
# see --coll) of every side, the
# ratios halka/Gloo, halka/MPI-tcp, halka/MPI-vader, and every side's
# #wrong.
#
# Every side gets the same untimed warm-up (default 20 operations per size):
# the tables are steady state, what a training loop that repeats its buckets
# sees. With 1 warm-up and 5 timed operations the sides measure mostly
# their start-up, halka's more than Gloo's (its first ~20 operations of a
# new size fault in gRPC's receive buffers; docs/performance.md, "The data
# path on loopback").
#
# Gloo comes from Debian's libgloo-dev, Open MPI from Debian's openmpi-bin
# and libopenmpi-dev; this script installs them when they are missing (as
# root, or with sudo) and builds gloo_bench.cc with g++ and mpi_bench.cc
# with mpicxx. mpirun runs with --allow-run-as-root --oversubscribe
# --bind-to none (G ranks may exceed the cores; Open MPI then yields when
# idle instead of spinning) and its runtime on loopback only.
#
# Usage: bench/compare/compare.sh [options]
#   --build DIR       halka build directory (default <repo>/build)
#   --worlds "2 4 8"  world sizes (default "2 4 8")
#   --min SIZE        smallest buffer (default 256K)
#   --max SIZE        largest buffer (default 64M); sizes go up by 4x
#   --iters N         timed iterations per size (default 30)
#   --warmup N        warm-up iterations per size (default 20)
#   --gloo-algo A     ring_chunked (default), ring, halving_doubling
#   --halka-args "…"  extra flags for halkactl bench (e.g. "--algo=ring",
#                     "--shm_links=false": TCP against TCP); {G} in them
#                     becomes the world size ("--shm_links=false
#                     --hosts={G}": every rank its own host, so that
#                     `auto` chooses as between hosts, not as on one)
#   --out DIR         also keep the raw JSON rows there
#   --halkactl PATH   this halkactl instead of BUILD/client/halkactl
#   --gloo-bench PATH a gloo_bench built beforehand (no apt, no g++: a
#                     machine without them, as bench/compare/run_on_host.sh
#                     runs it from a bundle)
#   --no-gloo         no Gloo side
#   --no-mpi          no Open MPI side
#   --mpi-transports "tcp vader"
#                     which Open MPI transports, in order (default both)
#   --mpi-bench PATH  an mpi_bench built beforehand (no apt, no mpicxx; the
#                     machine still needs Open MPI's mpirun)
#   --mpirun PATH     this mpirun (default: mpirun on PATH)
#   --mpi-args "…"    extra mpirun flags for every MPI run (e.g. "--mca
#                     btl_vader_single_copy_mechanism none" where the
#                     kernel refuses cross-memory attach)
#   --coll C          the collective: allreduce (default), broadcast,
#                     reduce, gather, scatter or alltoall (halkactl bench --coll and
#                     mpi_bench --coll; sizes are the whole buffer, busbw
#                     nccl-tests' factor for it). gloo_bench measures
#                     all-reduce only: another collective has no Gloo side
#   --tcp-congestion NAME
#                     every TCP side under this TCP congestion control:
#                     halka's wire links by --wire_congestion=NAME, Open
#                     MPI's and Gloo's sockets by congestion_preload.so
#                     (LD_PRELOAD; built here with cc). Without it each side
#                     keeps its default: the host's
#                     (net.ipv4.tcp_congestion_control), halka's wire links
#                     by their default --wire_congestion=system (a
#                     --wire_congestion in --halka-args changes halka's
#                     alone). The header says which each side used
#   --timeout SECS    limit for each side's run per world size (default
#                     1800); a run past it is killed, the other runs go
#                     on, and the script fails at the end
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
GLOO=1
MPI=1
COLL=allreduce
MPI_TRANSPORTS="tcp vader"
MPI_PREBUILT=""
MPIRUN=mpirun
MPI_ARGS=""
TCP_CONGESTION=""
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
    --no-gloo) GLOO=0; shift ;;
    --no-mpi) MPI=0; shift ;;
    --mpi-transports) MPI_TRANSPORTS="$2"; shift 2 ;;
    --mpi-bench) MPI_PREBUILT="$2"; shift 2 ;;
    --mpirun) MPIRUN="$2"; shift 2 ;;
    --mpi-args) MPI_ARGS="$2"; shift 2 ;;
    --timeout) RUN_TIMEOUT="$2"; shift 2 ;;
    --tcp-congestion) TCP_CONGESTION="$2"; shift 2 ;;
    --coll) COLL="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "compare.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for t in $MPI_TRANSPORTS; do
  case "$t" in
    tcp|vader) ;;
    *) echo "compare.sh: unknown MPI transport $t (tcp, vader)" >&2; exit 2 ;;
  esac
done
[ -n "$MPI_TRANSPORTS" ] || MPI=0
if [ -n "$TCP_CONGESTION" ] && ! [[ "$TCP_CONGESTION" =~ ^[a-z0-9_]{1,15}$ ]]; then
  echo "compare.sh: --tcp-congestion takes a congestion control's name (cubic, reno, bbr, ...)" >&2; exit 2
fi
case "$COLL" in
  allreduce) ;;
  broadcast|reduce|gather|scatter|alltoall)
    [ "$GLOO" = 1 ] && echo "compare.sh: --coll=$COLL: no Gloo side (gloo_bench measures all-reduce only)" >&2
    GLOO=0 ;;
  *) echo "compare.sh: unknown collective $COLL (allreduce, broadcast, reduce, gather, scatter, alltoall)" >&2; exit 2 ;;
esac

[ -n "$HALKACTL" ] || HALKACTL="$BUILD/client/halkactl"
[ -x "$HALKACTL" ] || { echo "compare.sh: no $HALKACTL; build halka first (scripts/build.sh)" >&2; exit 2; }
PYTHON=/usr/bin/python3
[ -x "$PYTHON" ] || PYTHON=python3

# apt_install PACKAGE...: the Debian packages not yet installed, as root or
# with sudo.
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
      || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "compare.sh: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >&2
}

WORK="$(mktemp -d /tmp/halka-compare.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
SIDES="halka"
if [ "$GLOO" = 1 ]; then
  SIDES+=" gloo"
  if [ -n "$GLOO_PREBUILT" ]; then
    [ -x "$GLOO_PREBUILT" ] || { echo "compare.sh: no $GLOO_PREBUILT" >&2; exit 2; }
    GLOO_BENCH="$GLOO_PREBUILT"
  else
    apt_install libgloo-dev
    GLOO_BENCH="$WORK/gloo_bench"
    g++ -O2 -std=c++20 -pthread "$ROOT/bench/compare/gloo_bench.cc" -o "$GLOO_BENCH" -lgloo
  fi
fi
if [ "$MPI" = 1 ]; then
  for t in $MPI_TRANSPORTS; do SIDES+=" mpi-$t"; done
  if [ -n "$MPI_PREBUILT" ]; then
    [ -x "$MPI_PREBUILT" ] || { echo "compare.sh: no $MPI_PREBUILT" >&2; exit 2; }
    MPI_BENCH="$MPI_PREBUILT"
  else
    apt_install openmpi-bin libopenmpi-dev
    MPI_BENCH="$WORK/mpi_bench"
    mpicxx -O2 -std=c++20 "$ROOT/bench/compare/mpi_bench.cc" -o "$MPI_BENCH"
  fi
  command -v "$MPIRUN" >/dev/null || {
    echo "compare.sh: no $MPIRUN (Open MPI's openmpi-bin); --no-mpi to go without" >&2; exit 2; }
fi

PRELOAD_ENV=()  # the MPI and Gloo sides' environment (--tcp-congestion)
HOST_CC=$(cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null || echo '?')
if [ -n "$TCP_CONGESTION" ]; then
  PRELOAD="$WORK/congestion_preload.so"
  cc -shared -fPIC -O2 -o "$PRELOAD" "$ROOT/bench/compare/congestion_preload.c" -ldl
  PRELOAD_ENV=(HALKA_BENCH_CONGESTION="$TCP_CONGESTION" LD_PRELOAD="$PRELOAD")
  HALKA_ARGS="$HALKA_ARGS --wire_congestion=$TCP_CONGESTION"
fi
echo "# $(date -u +%FT%TZ) on $(nproc) cores, $(uname -r); halka $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
if [ -n "$TCP_CONGESTION" ]; then
  echo "# TCP congestion control: $TCP_CONGESTION on every side (the host's default: $HOST_CC)"
else
  case "$HALKA_ARGS" in
    *--wire_congestion=*)
      v=${HALKA_ARGS##*--wire_congestion=}
      halka_cc="halka's wire links --wire_congestion=${v%% *}" ;;
    *) halka_cc="halka's wire links too (--wire_congestion=system)" ;;
  esac
  echo "# TCP congestion control: Open MPI and Gloo the host's $HOST_CC; $halka_cc"
fi
[ "$MPI" = 1 ] && echo "# $("$MPIRUN" --version 2>/dev/null | head -1)"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
FAILED=0
# fail SIDE G: the side's run failed; its log's tail, then on to the next.
fail() {
  echo "compare.sh: $1 failed for G=$2:" >&2
  tail -20 "$WORK/$1-$2.log" >&2
  FAILED=1
}
# refused SIDE G: with --tcp-congestion, whether the side's log says the
# kernel refused it (halka's worker, or congestion_preload.so): the side
# then ran under the host's, not the one the header names.
refused() {
  [ -n "$TCP_CONGESTION" ] || return 0
  if grep -q "the kernel refused" "$WORK/$1-$2.log" 2>/dev/null; then
    echo "compare.sh: $1 G=$2 did not run under $TCP_CONGESTION:" >&2
    grep "the kernel refused" "$WORK/$1-$2.log" | head -2 >&2
    FAILED=1
  fi
}
for g in $WORLDS; do
  halka_args=${HALKA_ARGS//\{G\}/$g}
  echo "## G=$g halka: halkactl bench --coll=$COLL --workers=$g -b $MIN -e $MAX -f 4 -n $ITERS -w $WARMUP $halka_args"
  # shellcheck disable=SC2086
  timeout -k 5 "$RUN_TIMEOUT" "$HALKACTL" bench --coll="$COLL" --workers="$g" -b "$MIN" -e "$MAX" -f 4 \
    -n "$ITERS" -w "$WARMUP" --json $halka_args 2>"$WORK/halka-$g.log" \
    | grep '^{' >"$WORK/halka-$g.json" || fail halka "$g"
  refused halka "$g"
  if [ "$GLOO" = 1 ]; then
    echo "## G=$g gloo: gloo_bench --world=$g --algo=$GLOO_ALGO"
    env ${PRELOAD_ENV[@]+"${PRELOAD_ENV[@]}"} timeout -k 5 "$RUN_TIMEOUT" "$GLOO_BENCH" --world="$g" --min="$MIN" --max="$MAX" \
      --factor=4 --iters="$ITERS" --warmup="$WARMUP" --algo="$GLOO_ALGO" \
      >"$WORK/gloo-$g.json" 2>"$WORK/gloo-$g.log" || fail gloo "$g"
    refused gloo "$g"
  fi
  [ "$MPI" = 1 ] || continue
  for t in $MPI_TRANSPORTS; do
    case "$t" in
      tcp) btl=(--mca btl "tcp,self" --mca btl_tcp_if_include lo) ;;
      vader) btl=(--mca btl "vader,self") ;;
    esac
    cmd=("$MPIRUN" --allow-run-as-root --oversubscribe -np "$g" --bind-to none
         --mca pml ob1 "${btl[@]}" --mca oob_tcp_if_include lo)
    if [ -n "$TCP_CONGESTION" ]; then
      cmd+=(-x HALKA_BENCH_CONGESTION="$TCP_CONGESTION" -x LD_PRELOAD="$PRELOAD")
    fi
    echo "## G=$g mpi-$t: ${cmd[*]} $MPI_ARGS mpi_bench"
    # shellcheck disable=SC2086
    timeout -k 5 "$RUN_TIMEOUT" "${cmd[@]}" $MPI_ARGS "$MPI_BENCH" --world="$g" \
      --min="$MIN" --max="$MAX" --factor=4 --iters="$ITERS" --warmup="$WARMUP" \
      --label="$t" --coll="$COLL" 2>"$WORK/mpi-$t-$g.log" </dev/null \
      | grep '^{' >"$WORK/mpi-$t-$g.json" || fail "mpi-$t" "$g"
    refused "mpi-$t" "$g"
  done
done
[ -n "$OUT" ] && { mkdir -p "$OUT"; cp "$WORK"/*.json "$OUT"/; }

# shellcheck disable=SC2086
"$PYTHON" - "$WORK" "$SIDES" $WORLDS <<'PY' || FAILED=1
import json, os, sys
work, sides, worlds = sys.argv[1], sys.argv[2].split(), [int(w) for w in sys.argv[3:]]

def load(name):
    rows = {}
    path = os.path.join(work, name)
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.startswith("{"):
                    r = json.loads(line)
                    rows[r["size"]] = r
    return rows

def human(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)

data = {s: {g: load(f"{s}-{g}.json") for g in worlds} for s in sides}
failed = False
for side in sides:
    print(f"\n{side}: busbw GB/s (time µs, #wrong)")
    for g in worlds:
        rows = data[side][g]
        if not rows:
            failed = True
            print(f"  G={g}: no rows (the run failed; see above)")
            continue
        cells = []
        for size in sorted(rows):
            r = rows[size]
            if r.get("error") or r["wrong"]:
                failed = True
            cells.append(f"{human(size)} {r['busbw_gbs']:.2f} ({r['time_us']:.0f}, {r['wrong']})"
                         + (f" ERROR {r['error']}" if r.get("error") else ""))
        print(f"  G={g}: " + " | ".join(cells))

others = [s for s in sides if s != "halka"]
names = {"halka": "halka", "gloo": "Gloo", "mpi-tcp": "MPI tcp", "mpi-vader": "MPI vader"}
print("\nbusbw GB/s, halka / " + " / ".join(names[s] for s in others)
      + "; ratios halka / each; #wrong per side")
head = (["G", "size"] + [names[s] for s in sides]
        + [f"halka/{names[s]}" for s in others] + ["#wrong " + "/".join(names[s] for s in sides)])
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for g in worlds:
    sizes = sorted(set().union(*[set(data[s][g]) for s in sides]))
    for size in sizes:
        rows = [data[s][g].get(size) for s in sides]
        bw = [f"{r['busbw_gbs']:.3f}" if r and not r.get("error") else "n/a" for r in rows]
        h = rows[0]
        ratios = []
        for r in rows[1:]:
            if h and r and not h.get("error") and not r.get("error") and r["busbw_gbs"] > 0:
                ratios.append(f"{h['busbw_gbs'] / r['busbw_gbs']:.2f}x")
            else:
                ratios.append("n/a")
        wrong = "/".join(str(r["wrong"]) if r else "-" for r in rows)
        print(f"| {g} | {human(size)} | " + " | ".join(bw + ratios + [wrong]) + " |")
if failed:
    print("\ncompare.sh: some rows are wrong or failed (see the tables)", file=sys.stderr)
    sys.exit(1)
PY
exit "$FAILED"
