#!/usr/bin/env bash
# Configures and builds halka into build/ (or $HALKA_BUILD_DIR).
# Extra arguments are passed to ninja (targets).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${HALKA_BUILD_DIR:-build}"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DHALKA_CUDA="${HALKA_CUDA:-AUTO}" ${HALKA_CMAKE_ARGS:-}
fi
ninja -C "$BUILD_DIR" -j"${HALKA_JOBS:-$(nproc)}" "$@"
