#!/usr/bin/env bash
# One command from a fresh Debian bookworm machine to halka's demo:
# installs the packages, builds, and runs `halkactl demo` (an embedded
# rendezvous and 4 workers; checked all-reduces; the ring health table).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh halkactl
exec "${HALKA_BUILD_DIR:-build}/client/halkactl" demo "$@"
