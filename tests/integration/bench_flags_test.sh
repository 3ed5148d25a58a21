#!/usr/bin/env bash
# halkactl bench's embedded-cluster flags for bench/compare/run_on_host.sh:
# --tls --tls_dir DIR runs under mutual TLS with certificates made
# beforehand (scripts/certs.sh DIR), with no openssl tool on the PATH, and
# every result is right (security_test checks what the links carry under
# TLS); --shm_spin_us runs right too. Refused with a clear error: --tls_dir
# without --tls, a directory without the certificates, --shm_spin_us out
# of 0-1000, and either flag with --worker (external workers).
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

refused() {  # refused WHAT EXPECTED-TEXT ARGS...
  local what=$1 text=$2
  shift 2
  if "$halkactl" bench -b 4K -e 4K -n 1 -w 0 "$@" >/dev/null 2>"$dir/err"; then
    fail "$what was accepted"
  fi
  grep -q -- "$text" "$dir/err" || fail "$what: unclear error: $(cat "$dir/err")"
  echo "ok: $what refused: $(tail -1 "$dir/err")"
}
refused "--shm_spin_us=5000" "must be 0-1000, got 5000" --workers=2 --shm_spin_us=5000
refused "--shm_spin_us with --worker" "set up the embedded cluster" \
  --worker=127.0.0.1:1 --shm_spin_us=20
refused "--tls_dir with --worker" "set up the embedded cluster" \
  --worker=127.0.0.1:1 --tls --tls_dir="$dir/certs"
