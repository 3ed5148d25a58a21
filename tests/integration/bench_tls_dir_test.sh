#!/usr/bin/env bash
# halkactl bench --tls --tls_dir DIR: the embedded cluster runs under mutual
# TLS with certificates made beforehand (scripts/certs.sh DIR), as on a host
# without the openssl tool (bench/compare/run_on_host.sh), and every result
# is right (security_test checks what the links carry under TLS).
# --tls_dir without --tls, and a directory without the certificates, are
# refused with a clear error.
set -euo pipefail
halkactl=$1
repo=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
dir=$(mktemp -d /tmp/halka-tlsdir.XXXXXX)
trap 'rm -rf "$dir"' EXIT
HALKA_CERT_DAYS=2 bash "$repo/scripts/certs.sh" "$dir/certs" >/dev/null

out=$(timeout 120 "$halkactl" bench --workers=2 -b 1M -e 1M -n 2 -w 1 \
        --shm_links=false --tls --tls_dir="$dir/certs" 2>"$dir/log") ||
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
