#!/bin/sh
# shellcheck disable=SC3028  # HOSTNAME: set by Docker and Kubernetes
# halka-entrypoint: the image's entrypoint. Runs its arguments (default:
# halkactl), after one optional step for StatefulSet pods:
#
#   HALKA_ORDINAL_FROM_HOSTNAME=1   take the ordinal N of the pod name
#       (NAME-N: $HALKA_POD_NAME, else $HOSTNAME) and use it as
#       halka-worker's rank (HALKA_RANK) or halka-ps's shard (HALKA_SHARD),
#       unless that variable is already set.
#
# Everything else is configured by the daemons themselves from HALKA_<FLAG>
# variables (HALKA_JOB, HALKA_WORLD_SIZE, HALKA_RENDEZVOUS, HALKA_LISTEN,
# HALKA_ADVERTISE, ...). exec keeps the daemon as PID 1 so SIGTERM reaches it.
set -eu

die() { echo "halka-entrypoint: $*" >&2; exit 2; }

ordinal() {
  name=${HALKA_POD_NAME:-${HOSTNAME:-$(cat /etc/hostname 2>/dev/null || true)}}
  n=${name##*-}
  case $n in
    '' | *[!0-9]*) die "HALKA_ORDINAL_FROM_HOSTNAME=1 but the pod name '$name' does not end in -<ordinal>" ;;
  esac
  [ "$n" != "$name" ] || die "pod name '$name' has no -<ordinal> suffix"
  echo "$n" | sed 's/^0*\([0-9]\)/\1/'   # no leading zeros, keep "0"
}

[ $# -gt 0 ] || set -- halkactl

if [ "${HALKA_ORDINAL_FROM_HOSTNAME:-0}" = 1 ]; then
  case $(basename "$1") in
    halka-worker)
      if [ -z "${HALKA_RANK:-}" ]; then
        HALKA_RANK=$(ordinal); export HALKA_RANK
      fi
      echo "halka-entrypoint: rank ${HALKA_RANK} (pod ${HALKA_POD_NAME:-${HOSTNAME:-?}})" >&2
      ;;
    halka-ps)
      if [ -z "${HALKA_SHARD:-}" ]; then
        HALKA_SHARD=$(ordinal); export HALKA_SHARD
      fi
      echo "halka-entrypoint: shard ${HALKA_SHARD} (pod ${HALKA_POD_NAME:-${HOSTNAME:-?}})" >&2
      ;;
  esac
fi

exec "$@"
