#!/usr/bin/env bash
# Builds the Docker base image `debian:bookworm-slim` locally with
# debuerreotype, for machines that reach a Debian mirror but not Docker Hub.
# Produces the same kind of image as the official one: minbase debootstrap,
# minimizing dpkg/apt config, slimified (no docs/man/locales), one layer.
#
#   deploy/docker/make-base-image.sh [TAG] [MIRROR]
#
#   TAG     default debian:bookworm-slim
#   MIRROR  default: the first `URIs:` of this host's
#           /etc/apt/sources.list.d/debian.sources (else deb.debian.org)
#
# Needs root, debootstrap, debuerreotype and a running Docker engine. The
# image's /etc/apt/sources.list.d/debian.sources points at MIRROR (and the
# matching -security archive), so `apt-get` inside builds uses the same
# mirror as this host.
set -Eeuo pipefail

TAG=${1:-debian:bookworm-slim}
SUITE=bookworm

host_mirror() {
  local f=/etc/apt/sources.list.d/debian.sources
  if [[ -r $f ]]; then
    awk '$1 == "URIs:" && $2 !~ /security/ { print $2; exit }' "$f"
    return
  fi
  [[ -r /etc/apt/sources.list ]] &&
    awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; ++i)
         if ($i ~ /^https?:/) { print $i; exit } }' /etc/apt/sources.list
}
MIRROR=${2:-$(host_mirror)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
MIRROR=${MIRROR%/}
SECURITY=${MIRROR%/debian}/debian-security

[[ $(id -u) -eq 0 ]] || { echo "make-base-image: needs root" >&2; exit 1; }
for t in debuerreotype-init debootstrap docker; do
  command -v "$t" >/dev/null || { echo "make-base-image: $t missing" >&2; exit 1; }
done

work=$(mktemp -d /var/tmp/halka-base.XXXXXX)
cleanup() {
  # debootstrap leaves proc/sys mounts behind when it fails half-way
  local m
  # shellcheck disable=SC2013  # mount points have no spaces here
  for m in $(awk -v d="$work/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
rootfs=$work/rootfs

echo "make-base-image: debootstrap $SUITE from $MIRROR into $rootfs"
debuerreotype-init --non-debian "$rootfs" "$SUITE" "$MIRROR"

# What debuerreotype-debian-sources-list would write, minus snapshot.d.o
# (unreachable here): the host's mirror, deb822 format, as in the
# official image.
rm -f "$rootfs/etc/apt/sources.list"
mkdir -p "$rootfs/etc/apt/sources.list.d"
cat > "$rootfs/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES

debuerreotype-minimizing-config "$rootfs"
debuerreotype-apt-get "$rootfs" update -qq
debuerreotype-apt-get "$rootfs" dist-upgrade -yqq
debuerreotype-slimify "$rootfs"
# The image gets Docker's resolv.conf and hostname at run time.
: > "$rootfs/etc/resolv.conf"
debuerreotype-tar "$rootfs" "$work/rootfs.tar"

epoch=$(< "$rootfs/debuerreotype-epoch")
docker import \
  --change 'CMD ["bash"]' \
  --message "debuerreotype $(debuerreotype-version | awk '{print $2}') $SUITE slim, mirror $MIRROR, epoch $epoch" \
  "$work/rootfs.tar" "$TAG" >/dev/null
echo "make-base-image: $TAG built ($(docker image inspect -f '{{.Size}}' "$TAG") bytes)"
