#!/usr/bin/env bash
# halka's Python tests (label python: the SDK, the torch backend's ops,
# DDP parity, a killed rank, running workers, and PyTorch's own distributed
# tests against gloo) on torch 2.6, in the Debian trixie root that
# scripts/trixie-env.sh makes and caches (the first time: debootstrap and
# Debian's packages, about 2.4 GB). CTest runs it as python_torch2 (labels
# python and torch2); by hand, as root:
#
#   scripts/trixie-torch2.sh            # make the root, build, test
#
# The build directory lives in the root, one per checkout
# (/halka-build-torch2-<hash of this checkout's path>), and builds the
# Python modules only; it is kept between runs. Exit 77 (CTest: skipped,
# saying why) when not root: the root needs debootstrap, chroot and mount.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
if [ "$(id -u)" -ne 0 ]; then
  echo "python_torch2: skipped: needs root (debootstrap, chroot, mount) to make the trixie root"
  exit 77
fi
build="/halka-build-torch2-$(printf '%s' "$REPO" | sha256sum | cut -c1-12)"
start=$(date +%s)
"$REPO/scripts/trixie-env.sh" make
echo "python_torch2: trixie root ready after $(( $(date +%s) - start )) s"
"$REPO/scripts/trixie-env.sh" run sh -c "
  set -e
  cmake -G Ninja -S '$REPO' -B '$build' -DHALKA_CUDA=OFF > '$build.cmake.log' 2>&1 ||
    { tail -30 '$build.cmake.log'; exit 1; }
  ninja -C '$build' _halka _halka_torch | tail -3
  echo \"python_torch2: built after \$(( \$(date +%s) - $start )) s\"
  python3 -c 'import torch; print(\"python_torch2: torch\", torch.__version__)'
  cd '$build'
  # This test itself (label torch2) does not run inside the root.
  ctest --output-on-failure -L python -LE torch2 --timeout 1800
"
echo "python_torch2: done after $(( $(date +%s) - start )) s"
