#!/usr/bin/env bash
# One command from a fresh Debian bookworm machine to halka's whole test
# suite: installs the packages, builds everything, runs CTest.
# Arguments go to ctest, e.g. `scripts/test.sh -L unit` for the fast part.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
cd "${HALKA_BUILD_DIR:-build}"
exec ctest --output-on-failure --timeout 1200 "$@"
