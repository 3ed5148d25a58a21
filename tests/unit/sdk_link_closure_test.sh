#!/usr/bin/env bash
# The SDK's link closure holds no daemon: the link line of a program that
# links only halka::client names none of the worker, rendezvous, parameter
# server, embedded-cluster, halkactl-bench or HTTP libraries. And its public
# headers stand alone: that program compiles without the source root on its
# include path, so a public header that includes worker/ (or server/,
# common/ internals) breaks its build.
#
#   sdk_link_closure_test.sh NINJA SOURCE_DIR BUILD_DIR SDK_ONLY_TARGET \
#                            CONTROL_TARGET
#
# CONTROL_TARGET links LocalCluster (hence the worker) and must be flagged:
# a check that flags nothing proves nothing. Reads the link commands with
# `ninja -t commands` (nothing is built); 77 (skipped) for other generators.
set -euo pipefail
ninja=$1 source=$2 build=$3 target=$4 control=$5
if [[ ! -f $build/build.ninja ]]; then
  echo "not a Ninja build: skipped"; exit 77
fi
forbidden='libhalka_(worker|rendezvous[a-z_]*|ps|local_cluster|bench|http)\.(a|so)'

# The last command ninja would run for a target is its link line.
link_line() { "$ninja" -C "$build" -t commands "$1" | tail -n 1; }

line=$(link_line "$target")
echo "link line of $target:"
echo "$line"
if [[ $line != *"-o client/$target "* ]]; then
  echo "FAIL: that is not the link command of $target"; exit 1
fi
if [[ $line != *libhalka_client.a* ]]; then
  echo "FAIL: $target does not link libhalka_client.a"; exit 1
fi
if bad=$(grep -oE "$forbidden" <<<"$line" | sort -u) && [[ -n $bad ]]; then
  echo "FAIL: the SDK's link closure holds daemon code:"; echo "$bad"; exit 1
fi
if ! grep -qE "$forbidden" <<<"$(link_line "$control")"; then
  echo "FAIL: the check does not flag $control, which links the worker"; exit 1
fi
if "$ninja" -C "$build" -t commands "$target" | grep -- "-o client/CMakeFiles/$target.dir/" |
    grep -qE -- "-I$source( |$)"; then
  echo "FAIL: $target compiles with -I$source (public headers must not need it)"
  exit 1
fi
echo "OK: $target links the SDK without worker or server libraries"
