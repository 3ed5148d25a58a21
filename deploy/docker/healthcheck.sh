#!/bin/bash
# halka-healthcheck [--tcp] [HOST:PORT]: exit 0 when the halka server at
# HOST:PORT is healthy; for Docker/Compose HEALTHCHECKs (Kubernetes uses
# its native grpc probes instead).
#
# Default address: 127.0.0.1 and the port of $HALKA_LISTEN.
# Uses `halkactl healthcheck` (grpc.health.v1.Health/Check: a worker is
# SERVING only once its ring formed) when this image's halkactl has that
# command. Otherwise, or with --tcp, it falls back to a stopgap that only
# proves the port accepts TCP connections.
set -u
mode=grpc
if [[ ${1:-} == --tcp ]]; then mode=tcp; shift; fi
addr=${1:-}
if [[ -z $addr ]]; then
  listen=${HALKA_LISTEN:-}
  [[ -n $listen ]] || { echo "halka-healthcheck: no address and no HALKA_LISTEN" >&2; exit 2; }
  addr=127.0.0.1:${listen##*:}
fi
if [[ $mode == grpc ]] && halkactl 2>&1 | grep -q '^ *healthcheck'; then
  exec halkactl healthcheck --worker="$addr" --timeout=2s
fi
host=${addr%:*} port=${addr##*:}
host=${host#[}; host=${host%]}
# shellcheck disable=SC2016  # $0/$1 expand in the inner bash
if timeout 2 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port" 2>/dev/null; then
  echo "$addr: accepting TCP connections"
  exit 0
fi
echo "$addr: not accepting TCP connections"
exit 1
