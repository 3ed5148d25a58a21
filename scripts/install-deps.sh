#!/usr/bin/env bash
# Installs what halka needs to build and test on Debian bookworm (as root,
# or with sudo). Idempotent: does nothing when everything is present.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
      libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
      libcpp-httplib-dev zlib1g-dev  # zlib: the deflated Join ring
      libssl-dev  # libcrypto: AES-OCB of sealed wire links
      iproute2 procps python3
      openssl clang libclang-rt-14-dev  # TLS test certificates; libFuzzer
      # The Python package and its torch.distributed backend (client/python)
      python3-dev pybind11-dev python3-numpy
      python3-torch libtorch-dev python3-sklearn
      debootstrap)  # the trixie root of the torch 2.x tests (python_torch2)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
