#!/usr/bin/env bash
# A cached Debian trixie root file system (g++ 14, Abseil 20240722,
# GoogleTest 1.16, torch 2.6) to build and test halka in, next to the
# bookworm host, without touching the host's packages or apt sources.
#
#   scripts/trixie-env.sh make        # once: debootstrap + apt-get install
#   scripts/trixie-env.sh run CMD...  # CMD as root in the root (chroot)
#   scripts/trixie-env.sh path        # prints the root's directory
#
# `run` makes the root first if needed, then runs CMD in the repository
# (bind-mounted at its host path, so paths agree) with /proc, /dev, /dev/pts
# and /dev/shm mounted. The mounts live in a private mount namespace
# (unshare -m) and are unmounted by a trap on exit as well, so nothing stays
# mounted on the host. A build directory for the tree is /halka-build inside
# the root ($HALKA_TRIXIE_ROOT/halka-build on the host), e.g.
#
#   scripts/trixie-env.sh run cmake -G Ninja -S . -B /halka-build
#   scripts/trixie-env.sh run ninja -C /halka-build -j2
#
# Environment: HALKA_TRIXIE_ROOT (default /var/cache/halka/trixie),
# HALKA_TRIXIE_MIRROR (default http://deb.debian.org/debian). The only
# network traffic is to that mirror (debootstrap and apt-get in the root).
# Idempotent: the root carries a stamp with the hash of the suite, mirror
# and package list; a changed list installs what is missing, an unchanged one
# does nothing. Needs root (debootstrap, chroot, mount).
set -euo pipefail

ROOT="${HALKA_TRIXIE_ROOT:-/var/cache/halka/trixie}"
MIRROR="${HALKA_TRIXIE_MIRROR:-http://deb.debian.org/debian}"
SUITE=trixie
REPO="$(cd "$(dirname "$0")/.." && pwd)"
STAMP="$ROOT/.halka-trixie-stamp"

# scripts/install-deps.sh's list (bookworm), as trixie spells it; without
# clang/libclang-rt-14-dev (the fuzz label).
PKGS=(build-essential g++-14 cmake ninja-build pkg-config
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
      libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
      libcpp-httplib-dev zlib1g-dev libssl-dev
      iproute2 procps python3 openssl ca-certificates
      git  # tests/docs/architecture_check.py lists the tracked files
      python3-dev pybind11-dev python3-numpy
      python3-torch libtorch-dev python3-sklearn
      python3-scikit-build-core python3-venv python3-pip  # pip install .
      python3-setuptools python3-expecttest)  # PyTorch's test harness

die() { echo "trixie-env: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot, mount)"

stamp_value() {
  printf '%s\n' "$SUITE" "$MIRROR" "${PKGS[@]}" | sha256sum | cut -d' ' -f1
}

# Mounts /proc, /dev, /dev/pts, /dev/shm and the repository into the root and
# runs "$@" there; only called inside `unshare -m` (see below).
MOUNTED=()
unmount_all() {
  local i
  for ((i = ${#MOUNTED[@]} - 1; i >= 0; i--)); do
    umount "${MOUNTED[i]}" 2>/dev/null || umount -l "${MOUNTED[i]}" 2>/dev/null || true
  done
  MOUNTED=()
}
in_root() {
  trap unmount_all EXIT
  trap 'exit 130' INT TERM HUP
  mount --make-rprivate / 2>/dev/null || true
  mount -t proc proc "$ROOT/proc"; MOUNTED+=("$ROOT/proc")
  mount --bind /dev "$ROOT/dev"; MOUNTED+=("$ROOT/dev")
  mount --bind /dev/pts "$ROOT/dev/pts" 2>/dev/null && MOUNTED+=("$ROOT/dev/pts")
  mkdir -p "$ROOT/dev/shm"
  mount -t tmpfs -o mode=1777,nosuid,nodev shm "$ROOT/dev/shm"; MOUNTED+=("$ROOT/dev/shm")
  mkdir -p "$ROOT$REPO"
  mount --bind "$REPO" "$ROOT$REPO"; MOUNTED+=("$ROOT$REPO")
  cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
  local rc=0
  (chroot "$ROOT" /usr/bin/env -i \
      HOME=/root TERM="${TERM:-dumb}" LANG=C.UTF-8 \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 \
      /bin/sh -c 'cd "$0" && exec "$@"' "$REPO" "$@") || rc=$?
  return $rc
}

# Runs "$@" in the root in a private mount namespace (mounts vanish with it,
# and the trap unmounts them too).
chroot_run() {
  unshare -m --propagation private -- \
    env HALKA_TRIXIE_ROOT="$ROOT" HALKA_TRIXIE_MIRROR="$MIRROR" \
    "$REPO/scripts/trixie-env.sh" __in_root "$@"
}

make_root() {
  local want; want="$(stamp_value)"
  if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
    return 0
  fi
  mkdir -p "$ROOT"
  exec 9>"$ROOT.lock"
  flock 9
  if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
    return 0
  fi
  local t0=$SECONDS
  if [ ! -f "$ROOT/.halka-debootstrap-done" ]; then
    echo "trixie-env: debootstrap $SUITE into $ROOT ($MIRROR)"
    case "$ROOT" in /|/usr|/var|/var/cache|"") die "refusing to remove $ROOT" ;; esac
    if grep -q " ${ROOT%/}/" /proc/mounts; then die "something is mounted under $ROOT"; fi
    rm -rf --one-file-system "$ROOT"
    mkdir -p "$ROOT"
    debootstrap --variant=minbase --components=main "$SUITE" "$ROOT" "$MIRROR"
    touch "$ROOT/.halka-debootstrap-done"
  fi
  printf 'deb %s %s main\n' "$MIRROR" "$SUITE" >"$ROOT/etc/apt/sources.list"
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    >"$ROOT/etc/apt/apt.conf.d/90halka-norecommends"
  echo "trixie-env: installing ${PKGS[*]}"
  chroot_run apt-get update -qq
  chroot_run apt-get install -y -qq --no-install-recommends "${PKGS[@]}"
  chroot_run apt-get clean
  echo "$want" >"$STAMP"
  echo "trixie-env: root ready in $((SECONDS - t0)) s, $(du -sh --one-file-system "$ROOT" | cut -f1)"
}

case "${1:-}" in
  make) make_root ;;
  path) echo "$ROOT" ;;
  run)
    shift
    [ $# -gt 0 ] || die "run needs a command"
    make_root
    chroot_run "$@"
    ;;
  __in_root) shift; in_root "$@" ;;
  *) echo "usage: $0 make | run CMD... | path" >&2; exit 2 ;;
esac
