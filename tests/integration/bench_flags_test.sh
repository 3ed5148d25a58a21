#!/usr/bin/env bash
# halkactl bench's embedded-cluster flags for bench/compare/run_on_host.sh:
# --tls --tls_dir DIR runs under mutual TLS with certificates made
# beforehand (scripts/certs.sh DIR), with no openssl tool on the PATH, and
# every result is right (security_test checks what the links carry under
# TLS); --shm_spin_us runs right too. Refused with a clear error: --tls_dir
# without --tls, a directory without the certificates, --shm_spin_us out
# of 0-1000, and either flag with --worker (external workers).
# --hosts=H: the embedded workers name H hosts and auto runs two_level on
# them; --model: the probe's line, and on every row the model's prediction
# for the algorithm that ran (its ratio to the measured time) and the
# algorithm it would pick.
set -euo pipefail
halkactl=$1
repo=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
dir=$(mktemp -d /tmp/halka-tlsdir.XXXXXX)
trap 'rm -rf "$dir"' EXIT
HALKA_CERT_DAYS=2 bash "$repo/scripts/certs.sh" "$dir/certs" >/dev/null

# No openssl on the PATH: the certificates can only come from --tls_dir.
out=$(timeout 120 env PATH=/nonexistent-halka "$halkactl" bench --workers=2 -b 1M \
        -e 1M -n 2 -w 1 --shm_links=false --tls --tls_dir="$dir/certs" 2>"$dir/log") ||
  fail "bench --tls --tls_dir exited $?: $(tail -5 "$dir/log")"
grep -q '^# mutual TLS' <<<"$out" || fail "no '# mutual TLS' line: $out"
row=$(awk '$1 == 1048576' <<<"$out")
[[ -n "$row" ]] || fail "no 1 MiB row: $out"
[[ $(awk '{print $9}' <<<"$row") == 0 ]] || fail "wrong elements: $row"
echo "ok: mutual TLS with --tls_dir: $row"

if "$halkactl" bench --workers=2 -b 4K -e 4K -n 1 -w 0 --tls_dir="$dir/certs" \
     >/dev/null 2>"$dir/err"; then
  fail "--tls_dir without --tls was accepted"
fi
grep -q -- "--tls_dir needs --tls" "$dir/err" || fail "unclear error: $(cat "$dir/err")"
echo "ok: --tls_dir without --tls refused: $(tail -1 "$dir/err")"

mkdir "$dir/empty"
if "$halkactl" bench --workers=2 -b 4K -e 4K -n 1 -w 0 --tls --tls_dir="$dir/empty" \
     >/dev/null 2>"$dir/err"; then
  fail "--tls_dir without certificates was accepted"
fi
grep -q "cannot read $dir/empty/ca.pem" "$dir/err" || fail "unclear error: $(cat "$dir/err")"
echo "ok: a directory without certificates refused: $(tail -1 "$dir/err")"

out=$(timeout 120 "$halkactl" bench --workers=2 -b 4K -e 64K -f 16 -n 20 -w 2 \
        --shm_spin_us=50 2>"$dir/log") || fail "bench --shm_spin_us=50 exited $?"
(( $(awk '$1 ~ /^[0-9]+$/ && NF >= 9' <<<"$out" | wc -l) == 2 )) || fail "rows: $out"
(( $(awk '$1 ~ /^[0-9]+$/ && NF >= 9 && $9 != 0' <<<"$out" | wc -l) == 0 )) ||
  fail "wrong elements with --shm_spin_us: $out"
echo "ok: --shm_spin_us=50 runs right"

out=$(timeout 120 "$halkactl" bench --workers=4 --hosts=2 --model -b 4K -e 1M \
        -f 16 -n 5 -w 1 --algo=ring,auto --shm_links=false 2>"$dir/log") ||
  fail "bench --hosts=2 --model exited $?: $(tail -5 "$dir/log")"
grep -qE '^# model: 4 ranks on 2 hosts; .*alpha [0-9.]+ us, B [0-9.]+ GB/s$' \
  <<<"$out" || fail "no model line: $out"
grep -qE '^ +size .*#wrong +model\(us\) meas/mod +model_best +best\(us\)$' \
  <<<"$out" || fail "no model columns in the header: $out"
rows=$(awk '$1 ~ /^[0-9]+$/' <<<"$out")
(( $(wc -l <<<"$rows") == 6 )) || fail "rows: $out"
# size count type redop algo time algbw busbw #wrong model ratio best best_us
(( $(awk 'NF == 13 && $9 == 0 && $10 > 0 && $11 > 0 && $13 > 0' <<<"$rows" | wc -l) == 6 )) ||
  fail "rows without a prediction, or wrong: $rows"
# auto on 2 hosts of 2: two_level above 64 KiB (the 1 MiB row), and the
# model's pick is one of the algorithms an all-reduce has.
[[ $(awk '$1 == 1048576 && NR % 2 == 0 {print $5}' <<<"$rows") == two_level ]] ||
  fail "auto at 1 MiB on 2 hosts did not run two_level: $rows"
(( $(awk '$12 !~ /^(ring|recursive_doubling|tree|naive|two_level)$/' <<<"$rows" | wc -l) == 0 )) ||
  fail "the model picked no all-reduce algorithm: $rows"
echo "ok: --hosts=2 --model: $(grep '^# model' <<<"$out")"

refused() {  # refused WHAT EXPECTED-TEXT ARGS...
  local what=$1 text=$2
  shift 2
  if "$halkactl" bench -b 4K -e 4K -n 1 -w 0 "$@" >/dev/null 2>"$dir/err"; then
    fail "$what was accepted"
  fi
  grep -q -- "$text" "$dir/err" || fail "$what: unclear error: $(cat "$dir/err")"
  echo "ok: $what refused: $(tail -1 "$dir/err")"
}
refused "--shm_spin_us=5000" "must be -1 (auto) or 0-1000, got 5000" --workers=2 --shm_spin_us=5000
refused "--shm_spin_us=-7" "must be -1 (auto) or 0-1000, got -7" --workers=2 --shm_spin_us=-7
refused "--shm_spin_us with --worker" "set up the embedded cluster" \
  --worker=127.0.0.1:1 --shm_spin_us=20
refused "--tls_dir with --worker" "set up the embedded cluster" \
  --worker=127.0.0.1:1 --tls --tls_dir="$dir/certs"
refused "--hosts with --worker" "set up the embedded cluster" \
  --worker=127.0.0.1:1 --hosts=2
refused "--hosts above --workers" "must be in \[0, --workers=2\]" --workers=2 --hosts=3
