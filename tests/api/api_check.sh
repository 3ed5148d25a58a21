#!/usr/bin/env bash
# API stability of halka.v1: every line of the committed baseline (one per
# message, field, enum value, service and method; halka_api_dump) must
# still describe the protos. A line that disappears is a breaking change:
# a field removed, renumbered, renamed, retyped or relabelled, a message or
# enum removed or moved to another file, an enum value removed or
# renumbered, a method removed or its types or streaming changed (buf's
# FILE and WIRE rules, without buf). New lines (additions) are allowed and
# listed.
#
#   api_check.sh DUMP DESCRIPTOR_SET BASELINE           check
#   api_check.sh DUMP DESCRIPTOR_SET BASELINE --update  rewrite the baseline
#
# --update is the deliberate step after an addition (so that it is kept
# from then on), never the way past a failure: a breaking change belongs in
# a new package (halka.v2), next to v1. `ninja -C build api_baseline` runs it.
set -euo pipefail
dump=$1 desc=$2 baseline=$3 mode=${4:-check}
export LC_ALL=C
current=$(mktemp)
trap 'rm -f "$current"' EXIT
"$dump" "$desc" > "$current"
echo "halka.v1 as built: $(wc -l < "$current") lines ($desc)"

if [[ $mode == --update ]]; then
  {
    echo "# halka.v1 API baseline: tests/api/api_check.sh fails when a line"
    echo "# below no longer describes the protos. Regenerate it only to keep"
    echo "# additions: ninja -C build api_baseline. See README (API)."
    cat "$current"
  } > "$baseline"
  echo "wrote $baseline"
  exit 0
fi
if [[ $mode != check ]]; then
  echo "unknown mode $mode (--update rewrites the baseline)"; exit 2
fi
if [[ ! -f $baseline ]]; then
  echo "FAIL: no baseline at $baseline (api_check.sh ... --update writes it)"
  exit 1
fi
base=$(grep -v '^#' "$baseline" | sort -u)
echo "baseline: $(wc -l <<<"$base") lines ($baseline)"
missing=$(comm -23 <(echo "$base") "$current")
added=$(comm -13 <(echo "$base") "$current")
if [[ -n $added ]]; then
  echo "added since the baseline (allowed; --update keeps them):"
  sed 's/^/  + /' <<<"$added"
fi
if [[ -n $missing ]]; then
  echo "FAIL: breaking change to halka.v1: these baseline lines no longer hold"
  echo "(a removed, renumbered, renamed, retyped or relabelled field, a removed"
  echo "message, enum value or method...; make it a new package, halka.v2):"
  sed 's/^/  - /' <<<"$missing"
  exit 1
fi
echo "OK: every baseline line holds"
