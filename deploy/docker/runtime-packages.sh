#!/bin/sh
# halka-runtime-packages ELF...: prints, one a line, the dpkg packages that
# own the shared libraries the given executables load (per ldd). Used by the
# Dockerfile's build stage so the runtime stage installs exactly those.
# Exits 1 when a library is missing or owned by no package, except the
# driver's libcuda/libnvidia-* (mounted from the host at run time).
set -eu
out=$(ldd "$@") || { echo "ldd failed" >&2; exit 1; }
missing=$(printf '%s\n' "$out" | awk '/not found/ { print $1 }' |
          grep -v -e '^libcuda\.so' -e '^libnvidia-' || true)
if [ -n "$missing" ]; then
  echo "missing libraries:" "$missing" >&2
  exit 1
fi
libs=$(printf '%s\n' "$out" |
       awk '$2 == "=>" && $3 ~ /^\// { print $3 }
            NF == 2 && $1 ~ /^\// && $1 !~ /:$/ { print $1 }' |
       sort -u)
pkgs=""
for lib in $libs; do
  case $lib in
    */libcuda.so*|*/libnvidia-*) continue ;;
  esac
  real=$(readlink -f "$lib")
  pkg=""
  # usrmerge: ldd and dpkg may disagree about /lib vs /usr/lib
  for cand in "$lib" "$real" "/usr$lib" "${lib#/usr}" "/usr$real" "${real#/usr}"; do
    pkg=$(dpkg-query -S "$cand" 2>/dev/null | grep -v '^diversion' |
          head -n 1 | cut -d: -f1) || true
    [ -n "$pkg" ] && break
  done
  if [ -z "$pkg" ]; then
    echo "no package owns $lib" >&2
    exit 1
  fi
  pkgs="$pkgs $pkg"
done
# shellcheck disable=SC2086  # one package a word
printf '%s\n' $pkgs | sort -u
